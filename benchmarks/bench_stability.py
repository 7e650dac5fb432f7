"""`sao bench stability`: long SAO runs at a policy lag >= 4 vs GRPO without DIS under the same lag.

Each (variant, seed) is a real `sao train` run (``trainer.runs.run.train`` in this process) of a tiny word-level model,
warm-started by `sao sft` on oracle demonstrations (``sao.benchmarks.rl_bench_common.warm_start``), on TokenGame
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

from sao.benchmarks.rl_bench_common import (
    SPEC_HINT,
    bench_run_config,
    env_texts,
    finite_mean,
    map_in_workers,
    print_table,
    register_bench_algorithms,
    smoothed,
    tiny_model_threads,
    train_run,
    warm_start,
    word_tokenizer,
    write_json,
)
from sao.core.config import load_yaml, merge
from sao.core.console import ProgressLine, say

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
    """Empty = the config's ``default_variants`` (every variant when it has none)."""
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int | None = None
    """Policy steps per run (default: the config's run.total_steps)."""
    window: int = 20
    plateau: float = 0.9
    max_drop: float = 0.1
    report_only: bool = False
    jobs: int = 1
    """Runs at a time, each in its own worker process (1 = one after another in this process)."""
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
    from sao.trainer.runs.metrics import read_metrics

    if not (run_dir / "metrics.jsonl").exists():
        return None
    rows = read_metrics(run_dir)
    return rows if len(rows) >= steps and (run_dir / "final").exists() else None


def _steps_written(run_dir: Path) -> int:
    """Lines of ``run_dir/metrics.jsonl`` so far (a running run's progress; 0 before its first step)."""
    try:
        with open(run_dir / "metrics.jsonl", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def _worker_init(log: str | None) -> None:
    """A bench worker process: its output to ``log`` (the console keeps one progress line), one torch thread,
    the bench algorithms registered, and a rendezvous port of its own (the parent's, inherited through the
    environment, would clash between parallel workers)."""
    import os
    import sys

    if log is not None:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
            os.environ.pop(key, None)  # sao.trainer.distributed.ensure_launch_env picks a free port for this worker
    tiny_model_threads(1)
    register_bench_algorithms()


def _warm_job(cfg: dict[str, Any], ws: dict[str, Any], out_dir: str, log: str | None) -> str:
    _worker_init(log)
    return str(warm_start({**cfg, "env": _warm_env(cfg)}, ws, Path(out_dir)))


def _run_job(cfg: dict[str, Any], run_dir: str, log: str | None) -> tuple[int, float, list[float]]:
    _worker_init(log)
    rows, wall = train_run(cfg, Path(run_dir))
    return len(rows), wall, _curve(rows, "success_rate")


def run(sc: StabilityConfig, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Every (variant, seed) run not already finished, then the summary table, JSON and plot. With ``sc.jobs``
    > 1 the warm starts, then the runs, go to that many worker processes (one torch thread each, output in
    ``runs/<run>.log``), with one progress line."""
    spec = merge(load_yaml(sc.config, SPEC_HINT), sc.overrides)
    known = spec.get("variants", {})
    variants = sc.variants or tuple(spec.get("default_variants") or known)
    bad = [v for v in variants if v not in known]
    if bad:
        raise ValueError(f"unknown variant(s) {bad}; {sc.config} defines {list(known)}")
    if not sc.seeds:
        raise ValueError("--seeds needs at least one seed, e.g. 0,1,2")
    if not (0 < sc.plateau <= 1 and sc.max_drop > 0 and sc.window >= 1):
        raise ValueError("--plateau must be in (0, 1], --max-drop > 0 and --window >= 1")
    if sc.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {sc.jobs}")
    steps = int(sc.steps or spec["base"].get("run", {}).get("total_steps", 1000))
    tiny_model_threads(1)
    register_bench_algorithms()
    sc.out.mkdir(parents=True, exist_ok=True)
    if not sc.report_only:
        _train_all(sc, spec, variants, steps, echo)
    return report(sc, spec, variants, echo)


def _train_all(
    sc: StabilityConfig, spec: dict[str, Any], variants: tuple[str, ...], steps: int, echo: Callable[[str], None]
) -> None:
    tokenizer, vocab = _tokenizer(spec, sc.out / "tokenizer")
    t_all = time.perf_counter()
    plan = [(v, seed) for seed in sc.seeds for v in variants]
    todo: list[tuple[str, int]] = []
    for k, (variant, seed) in enumerate(plan, 1):
        if _done(sc.out / "runs" / f"{variant}_seed{seed}", steps) is not None:
            echo(f"[{k}/{len(plan)}] {variant} seed {seed}: already finished")
        else:
            todo.append((variant, seed))
    if not todo:
        return
    logs = sc.jobs > 1
    ws = spec.get("warm_start")
    models: dict[int, str] = {}
    if ws:
        seeds = sorted({seed for _, seed in todo})
        warm_calls: list[tuple[Any, ...]] = []
        for seed in seeds:
            out_dir = sc.out / "warm" / f"seed{seed}"
            log = str(sc.out / "warm" / f"seed{seed}.log") if logs else None
            warm_calls.append((run_config(spec, todo[0][0], seed, steps, tokenizer, vocab), ws, str(out_dir), log))

        def warm_done(i: int, model: str) -> None:
            models[seeds[i]] = model

        map_in_workers(_warm_job, warm_calls, sc.jobs, warm_done, fresh_process=True)
        echo(f"warm starts ({len(seeds)}) ready after {time.perf_counter() - t_all:.0f}s")
    calls: list[tuple[Any, ...]] = []
    for variant, seed in todo:
        cfg = run_config(spec, variant, seed, steps, tokenizer, vocab)
        if seed in models:
            cfg["model"]["path"] = models[seed]
        run_dir = sc.out / "runs" / f"{variant}_seed{seed}"
        calls.append((cfg, str(run_dir), str(run_dir.with_name(run_dir.name + ".log")) if logs else None))
    _run_all(sc, todo, calls, steps, t_all, echo)


def _run_all(
    sc: StabilityConfig,
    todo: list[tuple[str, int]],
    calls: list[tuple[Any, ...]],
    steps: int,
    t_all: float,
    echo: Callable[[str], None],
) -> None:
    """The runs, a line each as it finishes; with worker processes (their output in logs) also the progress line
    (runs done, ETA by the steps every run has written, the runs in flight), our lines said above it. Run in this
    process, a run shows the trainer's own line."""
    finished = 0
    with ProgressLine("runs", len(todo), enabled=sc.jobs > 1, status="starting", every_s=60.0) as line:
        note = say if line.enabled else echo

        def one_done(i: int, res: tuple[int, float, list[float]]) -> None:
            nonlocal finished
            finished += 1
            n, wall, success = res
            s = stability_summary(success, sc.window, sc.plateau, sc.max_drop)
            variant, seed = todo[i]
            note(
                f"[{finished}/{len(todo)}] {variant} seed {seed}: {n} steps in {wall:.0f}s, plateau step "
                f"{s['plateau_step']}, largest drop {s['largest_drop_after_plateau']:.2f} "
                f"(elapsed {time.perf_counter() - t_all:.0f}s)"
            )
            line.set_work(finished * steps, len(todo) * steps)
            line.update(finished)

        def progress(running: set[int]) -> None:
            done_steps, parts, waiting = finished * steps, [], 0
            for i in sorted(running):  # the pool also counts the runs queued for the next free workers as running
                n = _steps_written(Path(calls[i][1]))
                done_steps += n
                if n:
                    parts.append(f"{todo[i][0]} s{todo[i][1]} {n}/{steps}")
                else:
                    waiting += 1
            if waiting:
                parts.append(f"{waiting} starting or queued")
            line.set_work(done_steps, len(todo) * steps)
            line.update(finished, ", ".join(parts))

        map_in_workers(_run_job, calls, sc.jobs, one_done, progress, every_s=10.0, fresh_process=True)


def report(
    sc: StabilityConfig, spec: dict[str, Any], variants: tuple[str, ...], echo: Callable[[str], None] = print
) -> dict[str, Any]:
    """Summaries of every finished or partial run under ``sc.out/runs``, the table, ``stability.json`` and PNG."""
    from sao.trainer.runs.metrics import read_metrics

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


def _line(ax: Any, xs: list[float], ys: list[float], **kw: Any) -> None:
    """One curve through its finite points (steps with no policy update log no entropy or actor grad norm; a gap
    per such step would break the line into dashes)."""
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(y)]
    ax.plot([p[0] for p in pts], [p[1] for p in pts], **kw)


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
                _line(ax, xs, drop_from_best(smoothed(c["success_rate"], w)), color=color, lw=0.9, label=label)
                ax.axhline(doc["max_drop"], color="k", ls=":", lw=0.8)
            elif key == "mask_frac":
                _line(ax, xs, smoothed(c["mask_frac_low"], w), color=color, lw=0.9, label=label)
                _line(ax, xs, smoothed(c["mask_frac_high"], w), color=color, lw=0.9, ls="--")
            else:
                _line(ax, xs, smoothed(c[key], w), color=color, lw=0.9, label=label)
            del name
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("policy step", fontsize=8)
    axes.flat[0].legend(fontsize=6)
    fig.suptitle("sao bench stability: one line per (variant, seed), smoothed", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
