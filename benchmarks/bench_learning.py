"""`sao bench learning`: SAO vs GRPO vs GRPO+DIS vs running-mean vs SAO K=1 vs SAO full-parameter critic.

Each (env, variant, seed) is a real `sao train` run (``trainer.run.train`` in this process) of a tiny random-init
model with a word-level tokenizer (see ``benchmarks.rl_bench_common``) on TokenGame-v0 and OnlineWriting-v0.
Variants differ only in the trainer config (``configs/bench/learning.yaml``); every run of a seed starts from
the same initial weights. OnlineWriting's shifting judge gets a schedule of its own per run, so runs never share
an episode counter.

Outputs under ``--out``: ``learning.json`` (every run's per-step curves and the summary), ``success_vs_step.png``,
``success_vs_time.png``, ``explained_variance.png``, and each run's directory. The summary table: final success
(mean over the last ``final_frac`` of the steps, then mean ± std over seeds), the steps and seconds until the
success rate (smoothed over ``smooth`` steps) first reaches the env's threshold (mean over the seeds that
reached it, with how many did), and the final explained variance of the critic variants.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.rl_bench_common import (
    build_word_tokenizer,
    deep_update,
    env_texts,
    load_yaml,
    mean_std,
    print_table,
    train_run,
    write_json,
)
from trainer.algos.registry import get_algorithm

DEFAULT_CONFIG = Path("configs/bench/learning.yaml")


@dataclass
class LearningConfig:
    out: Path = Path("runs/bench/learning")
    config: Path = DEFAULT_CONFIG
    envs: tuple[str, ...] = ()
    """Empty = every env of the config file."""
    variants: tuple[str, ...] = ()
    """Empty = every variant of the config file."""
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int | None = None
    """Policy steps per run (default: the env's run.total_steps in the config)."""
    scale: float = 1.0
    """Multiplies the steps (for bigger machines)."""
    smooth: int = 3
    final_frac: float = 0.2
    overrides: dict[str, Any] = field(default_factory=dict)


def smoothed(xs: list[float], k: int) -> list[float]:
    """Trailing moving average over ``k`` points (fewer at the start)."""
    out = []
    for i in range(len(xs)):
        w = xs[max(0, i - k + 1) : i + 1]
        out.append(sum(w) / len(w))
    return out


def first_reach(xs: list[float], threshold: float) -> int | None:
    """Index of the first value >= threshold, or None."""
    return next((i for i, x in enumerate(xs) if x >= threshold), None)


def run_curves(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per-step curves of one run: step, success, cumulative trainer seconds, explained variance (NaN if absent)."""
    t, clock = 0.0, []
    for r in rows:
        t += float(r["step_s"])
        clock.append(t)
    ev = [r.get("explained_variance") for r in rows]
    return {
        "step": [float(r["step"]) for r in rows],
        "success": [float(r["success_rate"]) for r in rows],
        "reward": [float(r["reward_mean"]) for r in rows],
        "time_s": clock,
        "explained_variance": [float(v) if isinstance(v, int | float) else float("nan") for v in ev],
    }


def summarize_runs(
    curves: list[dict[str, list[float]]], threshold: float, smooth: int, final_frac: float
) -> dict[str, Any]:
    """Across the seeds of one (env, variant)."""
    finals, steps_to, secs_to, evs = [], [], [], []
    for c in curves:
        n = len(c["success"])
        k = max(1, math.ceil(n * final_frac))
        finals.append(sum(c["success"][-k:]) / k)
        hit = first_reach(smoothed(c["success"], smooth), threshold)
        if hit is not None:
            steps_to.append(c["step"][hit])
            secs_to.append(c["time_s"][hit])
        ev_tail = [v for v in c["explained_variance"][-k:] if math.isfinite(v)]
        if ev_tail:
            evs.append(sum(ev_tail) / len(ev_tail))
    fm, fs = mean_std(finals)
    sm, _ = mean_std(steps_to)
    tm, _ = mean_std(secs_to)
    em, es = mean_std(evs)
    return {
        "final_success_mean": fm,
        "final_success_std": fs,
        "final_success_per_seed": finals,
        "reached": len(steps_to),
        "seeds": len(curves),
        "steps_to_threshold_mean": sm,
        "seconds_to_threshold_mean": tm,
        "final_explained_variance_mean": em,
        "final_explained_variance_std": es,
        "threshold": threshold,
    }


def make_tokenizer(env_spec: dict[str, Any], out: Path) -> tuple[Path, int]:
    env = env_spec.get("env", {})
    kwargs = dict(env.get("kwargs", {}))
    if env.get("id") == "sao/OnlineWriting-v0":
        kwargs["schedule"] = "bench-tokenizer-corpus"
    words = [str(w) for w in env_spec.get("rollout", {}).get("action_vocab", [])]
    texts = env_texts(str(env["id"]), kwargs, action=words[0] if words else "A")
    path = build_word_tokenizer(out, texts, words)
    from transformers import AutoTokenizer

    n = len(AutoTokenizer.from_pretrained(str(path)))
    return path, int(math.ceil(n / 8) * 8)


def run_config(
    spec: dict[str, Any], env_name: str, variant: str, seed: int, steps: int, tokenizer: Path, vocab: int
) -> dict[str, Any]:
    """The trainer config of one (env, variant, seed)."""
    env_spec = {k: v for k, v in spec["envs"][env_name].items() if k not in ("label", "threshold")}
    var_spec = {k: v for k, v in spec["variants"][variant].items() if k != "label"}
    cfg = deep_update(deep_update(spec.get("base", {}), env_spec), var_spec)
    cfg.setdefault("run", {}).update(seed=seed, total_steps=steps)
    model = cfg.setdefault("model", {})
    model["tokenizer"] = str(tokenizer)
    model.setdefault("tiny_overrides", {})["vocab_size"] = vocab
    env = cfg.setdefault("env", {})
    if env.get("id") == "sao/OnlineWriting-v0":
        env.setdefault("kwargs", {})["schedule"] = f"bench-{env_name}-{variant}-{seed}-{time.monotonic_ns()}"
    t = cfg.setdefault("trainer", {})
    if get_algorithm(str(t.get("algorithm", "sao"))).grouped:  # a batch holds whole groups
        bs, g = int(t.get("batch_size", 8)), int(t.get("group_size", 4))
        t["batch_size"] = max(g, bs // g * g)
    return cfg


def _plot(doc: dict[str, Any], out: Path, x_key: str, y_key: str, fname: str, ylabel: str, only_critic: bool) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(doc["envs"])
    fig, axes = plt.subplots(1, len(envs), figsize=(6 * len(envs), 3.8), squeeze=False)
    for ax, env in zip(axes[0], envs, strict=True):
        for _variant, res in doc["envs"][env]["variants"].items():
            if only_critic and not res["uses_critic"]:
                continue
            curves = res["curves"]
            n = min(len(c[y_key]) for c in curves)
            xs = [sum(c[x_key][i] for c in curves) / len(curves) for i in range(n)]
            per_seed = [smoothed(c[y_key][:n], doc["smooth"]) for c in curves]
            ys = [_nanmean([s[i] for s in per_seed]) for i in range(n)]
            lo = [min(s[i] for s in per_seed) for i in range(n)]
            hi = [max(s[i] for s in per_seed) for i in range(n)]
            (line,) = ax.plot(xs, ys, label=res["label"])
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.12)
        ax.set_title(doc["envs"][env]["label"], fontsize=10)
        ax.set_xlabel("policy step" if x_key == "step" else "trainer wall-clock (s)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    fig.suptitle(f"{ylabel} (mean over seeds, band = min..max, smoothed over {doc['smooth']} steps)", fontsize=9)
    fig.tight_layout()
    path = out / fname
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _nanmean(xs: list[float]) -> float:
    vals = [x for x in xs if math.isfinite(x)]
    return sum(vals) / len(vals) if vals else float("nan")


def run(lc: LearningConfig, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Every (env, variant, seed) run, the table, JSON + PNGs; returns the JSON document."""
    spec = deep_update(load_yaml(lc.config), lc.overrides)
    env_names = lc.envs or tuple(spec.get("envs", {}))
    var_names = lc.variants or tuple(spec.get("variants", {}))
    for kind, names, known in (
        ("env", env_names, spec.get("envs", {})),
        ("variant", var_names, spec.get("variants", {})),
    ):
        bad = [n for n in names if n not in known]
        if bad:
            raise ValueError(f"unknown {kind}(s) {bad}; {lc.config} defines {list(known)}")
    if not lc.seeds:
        raise ValueError("--seeds needs at least one seed, e.g. 0,1,2")
    lc.out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"benchmark": "learning", "seeds": list(lc.seeds), "smooth": lc.smooth, "envs": {}}
    total = len(env_names) * len(var_names) * len(lc.seeds)
    done, t_all = 0, time.perf_counter()
    for env_name in env_names:
        env_spec = spec["envs"][env_name]
        tokenizer, vocab = make_tokenizer(env_spec, lc.out / "tokenizers" / env_name)
        base_steps = int(deep_update(spec.get("base", {}), env_spec).get("run", {}).get("total_steps", 30))
        steps = max(1, math.ceil((lc.steps or base_steps) * lc.scale))
        threshold = float(env_spec.get("threshold", 0.5))
        entry: dict[str, Any] = {"label": env_spec.get("label", env_name), "threshold": threshold, "variants": {}}
        doc["envs"][env_name] = entry
        for variant in var_names:
            curves, walls = [], []
            cfg: dict[str, Any] = {}
            for seed in lc.seeds:
                cfg = run_config(spec, env_name, variant, seed, steps, tokenizer, vocab)
                rows, wall = train_run(cfg, lc.out / "runs" / env_name / f"{variant}_seed{seed}")
                curves.append(run_curves(rows))
                walls.append(wall)
                done += 1
                echo(
                    f"[{done}/{total}] {env_name} {variant} seed {seed}: final success "
                    f"{curves[-1]['success'][-1]:.2f}, {wall:.0f}s (elapsed {time.perf_counter() - t_all:.0f}s)"
                )
            s = summarize_runs(curves, threshold, lc.smooth, lc.final_frac)
            s["wall_s_mean"] = sum(walls) / len(walls)
            algo = cfg.get("trainer", {}).get("algorithm", "sao")
            entry["variants"][variant] = {
                "label": spec["variants"][variant].get("label", variant),
                "uses_critic": get_algorithm(algo).critic,
                "summary": s,
                "curves": curves,
                "config": cfg,
            }
    doc["total_wall_s"] = time.perf_counter() - t_all
    _print_summary(doc, echo)
    write_json(lc.out / "learning.json", doc)
    pngs = [
        _plot(doc, lc.out, "step", "success", "success_vs_step.png", "success rate", False),
        _plot(doc, lc.out, "time_s", "success", "success_vs_time.png", "success rate", False),
        _plot(doc, lc.out, "step", "explained_variance", "explained_variance.png", "explained variance", True),
    ]
    echo(f"\nwrote {lc.out / 'learning.json'} and {', '.join(str(p) for p in pngs)}")
    return doc


def _fmt(x: float, digits: int = 2) -> str:
    return "—" if not math.isfinite(x) else f"{x:.{digits}f}"


def _print_summary(doc: dict[str, Any], echo: Callable[[str], None]) -> None:
    headers = ["env", "variant", "final success", "reached", "steps to thr", "s to thr", "final EV", "s/run"]
    rows = []
    for env in doc["envs"].values():
        for res in env["variants"].values():
            s = res["summary"]
            rows.append(
                [
                    f"{env['label']} (thr {env['threshold']:g})",
                    res["label"],
                    f"{_fmt(s['final_success_mean'])} ± {_fmt(s['final_success_std'])}",
                    f"{s['reached']}/{s['seeds']}",
                    _fmt(s["steps_to_threshold_mean"], 1),
                    _fmt(s["seconds_to_threshold_mean"], 1),
                    _fmt(s["final_explained_variance_mean"]) if res["uses_critic"] else "n/a",
                    f"{s['wall_s_mean']:.0f}",
                ]
            )
    echo("")
    print_table(headers, rows, echo)
