"""`sao bench stability`: long SAO runs at a policy lag >= 4 vs GRPO without DIS under the same lag.

Each (variant, seed) is a real `sao train` run (``trainer.run.train`` in this process) of a tiny word-level model,
warm-started by `sao sft` on oracle demonstrations (``benchmarks.rl_bench_common.warm_start``), on TokenGame
wrapped in ``sao/Latency-v0`` (a lognormal wait per turn) with many episodes in flight, so trajectories reach the
trainer several versions old. Variants and sizes live in ``configs/bench/stability.yaml``.

What it reports per run, over policy steps: the success rate (smoothed over ``window`` steps), its drop from the
running best, entropy, explained variance, the fractions of action tokens masked low/high by DIS, actor and
critic gradient norms, policy lag. The stability criterion (the issue's goal): once the smoothed success first
reaches ``plateau`` (the run's plateau), it never falls more than ``max_drop`` below its running best.

Runs are resumable at run granularity: a run whose ``metrics.jsonl`` already holds every step is not redone, so
several invocations (e.g. one per seed, in parallel) can fill one ``--out`` and ``--report-only`` rebuilds the
table and plots from whatever runs exist. Outputs: ``stability.json``, ``stability.png``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.rl_bench_common import (
    bench_run_config,
    deep_update,
    env_texts,
    finite_mean,
    load_yaml,
    print_table,
    register_bench_algorithms,
    smoothed,
    tiny_model_threads,
    train_run,
    warm_start,
    word_tokenizer,
    write_json,
)

DEFAULT_CONFIG = Path("configs/bench/stability.yaml")
CURVE_KEYS = (
    "success_rate",
    "entropy",
    "explained_variance",
    "mask_frac_low",
    "mask_frac_high",
    "clip_frac",
    "actor_grad_norm",
    "critic_grad_norm",
    "policy_lag_mean",
    "advantage_std",
)


@dataclass
class StabilityConfig:
    out: Path = Path("runs/bench/stability")
    config: Path = DEFAULT_CONFIG
    variants: tuple[str, ...] = ()
    """Empty = every variant of the config file."""
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int | None = None
    """Policy steps per run (default: the config's run.total_steps)."""
    window: int = 20
    plateau: float = 0.9
    max_drop: float = 0.1
    report_only: bool = False
    overrides: dict[str, Any] = field(default_factory=dict)


def drop_from_best(xs: list[float]) -> list[float]:
    """``best_so_far(t) - x(t)`` (>= 0), the fall below the running best at every point."""
    best, out = -math.inf, []
    for x in xs:
        best = max(best, x)
        out.append(best - x)
    return out


def stability_summary(success: list[float], window: int, plateau: float, max_drop: float) -> dict[str, Any]:
    """The criterion on one run's per-step success: where the smoothed curve first reaches ``plateau``, the
    largest drop from its running best after that, and whether that drop stays within ``max_drop``."""
    s = smoothed(success, window)
    hit = next((i for i, x in enumerate(s) if x >= plateau), None)
    drops = drop_from_best(s)
    after = drops[hit:] if hit is not None else []
    largest = max(after) if after else float("nan")
    tail = max(1, len(success) // 10)
    return {
        "steps": len(success),
        "plateau_step": hit + 1 if hit is not None else None,
        "largest_drop_after_plateau": largest,
        "largest_drop_step": (hit + after.index(largest) + 1) if hit is not None and after else None,
        "stable": bool(after) and largest <= max_drop,
        "best_smoothed": max(s) if s else float("nan"),
        "final_success": sum(success[-tail:]) / tail if success else float("nan"),
    }


def _curve(rows: list[dict[str, Any]], key: str) -> list[float]:
    out = []
    for r in rows:
        v = r.get(key)
        out.append(float(v) if isinstance(v, int | float) and not isinstance(v, bool) else float("nan"))
    return out


def run_summary(rows: list[dict[str, Any]], window: int, plateau: float, max_drop: float) -> dict[str, Any]:
    """The criterion plus the dynamics a reader needs to say why a run held or fell."""
    curves = {k: _curve(rows, k) for k in CURVE_KEYS}
    s = stability_summary(curves["success_rate"], window, plateau, max_drop)
    ent = [x for x in curves["entropy"] if math.isfinite(x)]
    s.update(
        entropy_min=min(ent) if ent else float("nan"),
        entropy_final=finite_mean(curves["entropy"][-window:]),
        explained_variance_mean=finite_mean(curves["explained_variance"]),
        mask_frac_low_mean=finite_mean(curves["mask_frac_low"]),
        mask_frac_high_mean=finite_mean(curves["mask_frac_high"]),
        actor_grad_norm_max=max((x for x in curves["actor_grad_norm"] if math.isfinite(x)), default=float("nan")),
        policy_lag_mean=finite_mean(curves["policy_lag_mean"]),
        policy_lag_max=max((int(r.get("policy_lag_max", 0)) for r in rows), default=0),
        dropped_stale=int(rows[-1].get("dropped_stale", 0)) if rows else 0,
        wall_s=sum(float(r.get("step_s", 0.0)) for r in rows),
    )
    return s


def _tokenizer(spec: dict[str, Any], out: Path) -> tuple[Path, int]:
    env = spec["base"]["env"]
    kwargs = dict(env.get("kwargs", {}))
    inner_id = str(kwargs.get("inner_id", env["id"]))
    inner_kwargs = dict(kwargs.get("inner_kwargs", kwargs))
    words = [str(w) for w in spec["base"].get("rollout", {}).get("action_vocab", [])]
    return word_tokenizer(out, env_texts(inner_id, inner_kwargs, action=words[0] if words else "A"), words)


def run_config(
    spec: dict[str, Any], variant: str, seed: int, steps: int, tokenizer: Path, vocab: int
) -> dict[str, Any]:
    var = {k: v for k, v in spec["variants"][variant].items() if k != "label"}
    return bench_run_config(spec["base"], var, seed, steps, tokenizer, vocab)


def _warm_env(cfg: dict[str, Any]) -> dict[str, Any]:
    """The env the demonstrations are played on: the latency wrapper's inner env (no waits needed)."""
    env = cfg["env"]
    kw = env.get("kwargs", {})
    if "inner_id" in kw:
        return {"id": kw["inner_id"], "kwargs": dict(kw.get("inner_kwargs", {}))}
    return dict(env)


def _done(run_dir: Path, steps: int) -> list[dict[str, Any]] | None:
    from trainer.metrics import read_metrics

    if not (run_dir / "metrics.jsonl").exists():
        return None
    rows = read_metrics(run_dir)
    return rows if len(rows) >= steps and (run_dir / "final").exists() else None


def run(sc: StabilityConfig, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Every (variant, seed) run not already finished, then the summary table, JSON and plot."""
    spec = deep_update(load_yaml(sc.config), sc.overrides)
    variants = sc.variants or tuple(spec.get("variants", {}))
    bad = [v for v in variants if v not in spec.get("variants", {})]
    if bad:
        raise ValueError(f"unknown variant(s) {bad}; {sc.config} defines {list(spec.get('variants', {}))}")
    if not sc.seeds:
        raise ValueError("--seeds needs at least one seed, e.g. 0,1,2")
    if not (0 < sc.plateau <= 1 and sc.max_drop > 0 and sc.window >= 1):
        raise ValueError("--plateau must be in (0, 1], --max-drop > 0 and --window >= 1")
    steps = int(sc.steps or spec["base"].get("run", {}).get("total_steps", 1000))
    tiny_model_threads(1)
    register_bench_algorithms()
    sc.out.mkdir(parents=True, exist_ok=True)
    if not sc.report_only:
        tokenizer, vocab = _tokenizer(spec, sc.out / "tokenizer")
        t_all, total, done = time.perf_counter(), len(variants) * len(sc.seeds), 0
        for seed in sc.seeds:
            for variant in variants:
                cfg = run_config(spec, variant, seed, steps, tokenizer, vocab)
                run_dir = sc.out / "runs" / f"{variant}_seed{seed}"
                done += 1
                if _done(run_dir, steps) is not None:
                    echo(f"[{done}/{total}] {variant} seed {seed}: already finished")
                    continue
                ws = spec.get("warm_start")
                if ws:
                    wcfg = {**cfg, "env": _warm_env(cfg)}
                    cfg["model"]["path"] = str(warm_start(wcfg, ws, sc.out / "warm" / f"seed{seed}"))
                rows, wall = train_run(cfg, run_dir)
                s = stability_summary(_curve(rows, "success_rate"), sc.window, sc.plateau, sc.max_drop)
                echo(
                    f"[{done}/{total}] {variant} seed {seed}: {len(rows)} steps in {wall:.0f}s, plateau step "
                    f"{s['plateau_step']}, largest drop {s['largest_drop_after_plateau']:.2f} "
                    f"(elapsed {time.perf_counter() - t_all:.0f}s)"
                )
    return report(sc, spec, variants, echo)


def report(
    sc: StabilityConfig, spec: dict[str, Any], variants: tuple[str, ...], echo: Callable[[str], None] = print
) -> dict[str, Any]:
    """Summaries of every finished or partial run under ``sc.out/runs``, the table, ``stability.json`` and PNG."""
    from trainer.metrics import read_metrics

    doc: dict[str, Any] = {
        "benchmark": "stability",
        "window": sc.window,
        "plateau": sc.plateau,
        "max_drop": sc.max_drop,
        "runs": {},
    }
    for variant in variants:
        for seed in sc.seeds:
            run_dir = sc.out / "runs" / f"{variant}_seed{seed}"
            if not (run_dir / "metrics.jsonl").exists():
                continue
            rows = read_metrics(run_dir)
            if not rows:
                continue
            doc["runs"][f"{variant}_seed{seed}"] = {
                "variant": variant,
                "label": spec["variants"][variant].get("label", variant),
                "seed": seed,
                "summary": run_summary(rows, sc.window, sc.plateau, sc.max_drop),
                "curves": {"step": [float(r["step"]) for r in rows], **{k: _curve(rows, k) for k in CURVE_KEYS}},
            }
    _print(doc, echo)
    write_json(sc.out / "stability.json", doc)
    if doc["runs"]:
        png = plot(doc, sc.out / "stability.png")
        echo(f"\nwrote {sc.out / 'stability.json'} and {png}")
    return doc


def _fmt(x: Any, digits: int = 2) -> str:
    if x is None:
        return "—"
    if isinstance(x, float) and not math.isfinite(x):
        return "—"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def _print(doc: dict[str, Any], echo: Callable[[str], None]) -> None:
    headers = [
        "run", "steps", "plateau step", "largest drop", "stable", "final success", "min entropy",
        "mean EV", "masked low/high", "max actor gn", "lag mean/max",
    ]  # fmt: skip
    rows = []
    for name, r in doc["runs"].items():
        s = r["summary"]
        rows.append(
            [
                f"{r['label']} s{r['seed']}" if name else name,
                str(s["steps"]),
                _fmt(s["plateau_step"]),
                _fmt(s["largest_drop_after_plateau"]),
                "yes" if s["stable"] else "no",
                _fmt(s["final_success"]),
                _fmt(s["entropy_min"], 3),
                _fmt(s["explained_variance_mean"]),
                f"{_fmt(s['mask_frac_low_mean'], 3)}/{_fmt(s['mask_frac_high_mean'], 3)}",
                _fmt(s["actor_grad_norm_max"], 1),
                f"{_fmt(s['policy_lag_mean'])}/{s['policy_lag_max']}",
            ]
        )
    echo("")
    print_table(headers, rows, echo)


def plot(doc: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("success_rate", f"success (smoothed over {doc['window']} steps)", True),
        ("drop", "drop from running best (smoothed success)", False),
        ("entropy", "policy entropy (nats)", True),
        ("explained_variance", "critic explained variance", True),
        ("mask_frac", "masked by DIS: low (solid) / high (dashed)", True),
        ("actor_grad_norm", "actor grad norm (before clipping)", True),
        ("critic_grad_norm", "critic grad norm", True),
        ("policy_lag_mean", "mean policy lag (versions)", True),
    ]
    fig, axes = plt.subplots(2, 4, figsize=(20, 7.5))
    colors: dict[str, Any] = {}
    w = doc["window"]
    for ax, (key, title, _) in zip(axes.flat, panels, strict=True):
        for name, r in doc["runs"].items():
            c = r["curves"]
            color = colors.setdefault(r["variant"], f"C{len(colors)}")
            label = f"{r['label']} s{r['seed']}"
            xs = c["step"]
            if key == "drop":
                ax.plot(xs, drop_from_best(smoothed(c["success_rate"], w)), color=color, lw=0.9, label=label)
                ax.axhline(doc["max_drop"], color="k", ls=":", lw=0.8)
            elif key == "mask_frac":
                ax.plot(xs, smoothed(c["mask_frac_low"], w), color=color, lw=0.9, label=label)
                ax.plot(xs, smoothed(c["mask_frac_high"], w), color=color, lw=0.9, ls="--")
            else:
                ax.plot(xs, smoothed(c[key], w), color=color, lw=0.9, label=label)
            del name
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("policy step", fontsize=8)
    axes.flat[0].legend(fontsize=6)
    fig.suptitle("sao bench stability: one line per (variant, seed), smoothed", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
