"""`sao bench learning`: the paper's claims at CPU scale, one task per claim, variants side by side.

Each (task, variant, seed) is a real `sao train` run (``trainer.runs.run.train`` in this process) of a tiny model with
a word-level tokenizer (see ``sao.benchmarks.rl_bench_common``). Before RL the model is made competent by `sao sft` on
oracle demonstrations (``rl_bench_common.warm_start``, one model per task family and seed, shared by every
variant of that seed), so a frozen-attention critic inherits attention that already reads the prompt. Tasks,
families and variants live in ``configs/bench/learning.yaml``; every variant of a task gets the same trajectory
budget (steps x batch). OnlineWriting's shifting judge gets a schedule of its own per run.

Outputs under ``--out``: ``learning.json`` (every run's per-step curves and the summary), ``success_vs_step.png``
(mean over seeds, band = min..max), ``dynamics.png`` (explained variance, critic gradient norm, fractions of
tokens masked low/high by DIS, policy lag), and each run's directory. The summary table: final success (mean
over the last ``final_frac`` of the steps, then mean ± std over seeds), steps until the smoothed success first
reaches the task's threshold (mean over the seeds that reached it, with how many did), the final explained
variance of the critic variants and, for tasks with ``post_shift_steps``, the success in the steps right after
each preference shift.
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
    mean_std,
    print_table,
    register_bench_algorithms,
    smoothed,
    tiny_model_threads,
    train_run,
    warm_start,
    warm_start_check,
    word_tokenizer,
    write_json,
)
from sao.core.config import load_yaml, merge

DEFAULT_CONFIG = Path("configs/bench/learning.yaml")
DYNAMICS = ("explained_variance", "critic_grad_norm", "mask_frac_low", "mask_frac_high", "policy_lag_mean")


@dataclass
class LearningConfig:
    out: Path = Path("runs/bench/learning")
    config: Path = DEFAULT_CONFIG
    tasks: tuple[str, ...] = ()
    """Empty = every task of the config file."""
    variants: tuple[str, ...] = ()
    """Empty = each task's own variant list; otherwise only these (where the task lists them)."""
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int | None = None
    """Policy steps per run (default: the task's run.total_steps in the config)."""
    scale: float = 1.0
    """Multiplies the steps (for bigger machines)."""
    smooth: int = 3
    final_frac: float = 0.2
    overrides: dict[str, Any] = field(default_factory=dict)
    jobs: int = 1
    """Worker processes for the runs (1 = all in this process); each uses one torch thread."""


def first_reach(xs: list[float], threshold: float) -> int | None:
    """Index of the first value >= threshold, or None."""
    return next((i for i, x in enumerate(xs) if x >= threshold), None)


def _num(v: Any) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else float("nan")


def run_curves(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per-step curves of one run: step, success, reward, cumulative trainer seconds, episodes generated, and the
    training dynamics (``DYNAMICS``; NaN where a run does not log one, e.g. no critic)."""
    t, clock = 0.0, []
    for r in rows:
        t += float(r["step_s"])
        clock.append(t)
    out = {
        "step": [float(r["step"]) for r in rows],
        "success": [float(r["success_rate"]) for r in rows],
        "reward": [float(r["reward_mean"]) for r in rows],
        "time_s": clock,
        "generated": [_num(r.get("generated")) for r in rows],
    }
    for key in DYNAMICS:
        out[key] = [_num(r.get(key)) for r in rows]
    return out


def post_shift_success(curve: dict[str, list[float]], shift_every: int, window: int) -> list[float]:
    """Mean success over the ``window`` steps after each preference shift. Shift ``j`` happens at episode
    ``j * shift_every``; its first step is the first whose cumulative ``generated`` count has passed it."""
    gen, succ = curve.get("generated", []), curve["success"]
    out: list[float] = []
    j = 1
    while True:
        first = next((i for i, g in enumerate(gen) if math.isfinite(g) and g >= j * shift_every), None)
        if first is None or first + window > len(succ):
            return out
        out.append(sum(succ[first : first + window]) / window)
        j += 1


def summarize_runs(
    curves: list[dict[str, list[float]]],
    threshold: float,
    smooth: int,
    final_frac: float,
    shift: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Across the seeds of one (task, variant); ``shift`` = (shift_every episodes, post-shift window in steps)."""
    finals, steps_to, secs_to, evs, post = [], [], [], [], []
    for c in curves:
        n = len(c["success"])
        k = max(1, math.ceil(n * final_frac))
        finals.append(sum(c["success"][-k:]) / k)
        hit = first_reach(smoothed(c["success"], smooth), threshold)
        if hit is not None:
            steps_to.append(c["step"][hit])
            secs_to.append(c["time_s"][hit])
        ev_tail = [v for v in c.get("explained_variance", [])[-k:] if math.isfinite(v)]
        if ev_tail:
            evs.append(sum(ev_tail) / len(ev_tail))
        if shift is not None:
            ps = post_shift_success(c, *shift)
            if ps:
                post.append(sum(ps) / len(ps))
    fm, fs = mean_std(finals)
    sm, _ = mean_std(steps_to)
    tm, _ = mean_std(secs_to)
    em, es = mean_std(evs)
    pm, ps_ = mean_std(post)
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
        "post_shift_success_mean": pm,
        "post_shift_success_std": ps_,
        "threshold": threshold,
    }


def make_tokenizer(family: dict[str, Any], out: Path) -> tuple[Path, int]:
    """The family's word-level tokenizer (the words of its envs' texts plus its action words) and the tiny
    model's vocabulary size (rounded up to a multiple of 8)."""
    words = [str(w) for w in family.get("action_vocab", [])]
    texts: list[str] = []
    for env in family.get("texts", []):
        texts += env_texts(str(env["id"]), dict(env.get("kwargs", {})), action=words[0] if words else "A")
    return word_tokenizer(out, texts, words)


def task_variants(spec: dict[str, Any], task: str, only: tuple[str, ...] = ()) -> list[str]:
    listed = list(spec["tasks"][task].get("variants") or spec.get("variants", {}))
    return [v for v in listed if not only or v in only]


def run_config(
    spec: dict[str, Any],
    task: str,
    variant: str,
    seed: int,
    steps: int,
    tokenizer: Path,
    vocab: int,
    model_path: str | None = None,
) -> dict[str, Any]:
    """The trainer config of one (task, variant, seed); ``model_path``: the warm-started model (None: tiny init)."""
    skip = ("label", "claim", "threshold", "family", "variants", "post_shift_steps")
    task_spec = {k: v for k, v in spec["tasks"][task].items() if k not in skip}
    var_spec = {k: v for k, v in spec["variants"][variant].items() if k != "label"}
    cfg = bench_run_config(merge(spec.get("base", {}), task_spec), var_spec, seed, steps, tokenizer, vocab)
    if model_path is not None:
        cfg["model"]["path"] = model_path
    env = cfg.setdefault("env", {})
    if env.get("id") == "sao/OnlineWriting-v0":
        env.setdefault("kwargs", {})["schedule"] = f"bench-{task}-{variant}-{seed}-{time.monotonic_ns()}"
    t = cfg.setdefault("trainer", {})
    from sao.trainer.algos.registry import get_algorithm

    register_bench_algorithms()
    if get_algorithm(str(t.get("algorithm", "sao"))).grouped:
        bs, g = int(t.get("batch_size", 8)), int(t.get("group_size", 4))
        t["batch_size"] = max(g, bs // g * g)
    return cfg


def _uses_critic(cfg: dict[str, Any]) -> bool:
    from sao.trainer.algos.registry import get_algorithm

    return bool(get_algorithm(str(cfg.get("trainer", {}).get("algorithm", "sao"))).critic)


def _band(ax: Any, curves: list[dict[str, list[float]]], key: str, smooth: int, label: str, **kw: Any) -> None:
    n = min(len(c[key]) for c in curves)
    xs = [c for c in curves[0]["step"][:n]]
    per_seed = [smoothed(c[key][:n], smooth) for c in curves]
    ys = [finite_mean([s[i] for s in per_seed]) for i in range(n)]
    lo = [min((s[i] for s in per_seed if math.isfinite(s[i])), default=float("nan")) for i in range(n)]
    hi = [max((s[i] for s in per_seed if math.isfinite(s[i])), default=float("nan")) for i in range(n)]
    (line,) = ax.plot(xs, ys, label=label, **kw)
    ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.12)


def plot_success(doc: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(doc["tasks"])
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4.0), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        for i, res in enumerate(doc["tasks"][task]["variants"].values()):
            _band(ax, res["curves"], "success", doc["smooth"], res["label"], color=f"C{i % 10}")
        ax.set_title(doc["tasks"][task]["label"], fontsize=9)
        ax.set_xlabel("policy step")
        ax.set_ylabel("success rate")
        ax.legend(fontsize=6)
    fig.suptitle(f"success (mean over seeds, band = min..max, smoothed over {doc['smooth']} steps)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def plot_dynamics(doc: dict[str, Any], path: Path) -> Path:
    """One row per task: explained variance, critic grad norm, DIS masked low, masked high, policy lag."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(doc["tasks"])
    titles = ["critic explained variance", "critic grad norm", "masked low by DIS", "masked high by DIS",
              "mean policy lag"]  # fmt: skip
    fig, axes = plt.subplots(len(tasks), len(DYNAMICS), figsize=(4.2 * len(DYNAMICS), 3.0 * len(tasks)), squeeze=False)
    for row, task in zip(axes, tasks, strict=True):
        for ax, key, title in zip(row, DYNAMICS, titles, strict=True):
            for i, res in enumerate(doc["tasks"][task]["variants"].values()):  # one colour per variant in a row
                if all(not math.isfinite(x) for c in res["curves"] for x in c[key]):
                    continue
                _band(ax, res["curves"], key, doc["smooth"], res["label"], lw=0.9, color=f"C{i % 10}")
            ax.set_title(f"{doc['tasks'][task]['label'][:28]}: {title}", fontsize=7)
            ax.tick_params(labelsize=7)
        row[-1].legend(fontsize=5)  # the lag panel plots every variant (0 for synchronous ones)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)
    return path


def _warm_job(wcfg: dict[str, Any], ws: dict[str, Any], out_dir: str) -> tuple[str, dict[str, Any]]:
    """One family's warm start for one seed (in a worker process): `sao sft` on the oracle's demonstrations, then
    ``warm_start_check`` on held-out episodes. Returns the model dir and the check."""
    _worker_init()
    model = warm_start(wcfg, ws, Path(out_dir))
    env = dict(ws.get("env", wcfg["env"]))
    words = [str(w) for w in wcfg.get("rollout", {}).get("action_vocab", [])]
    kwargs, seed = dict(env.get("kwargs", {})), int(wcfg["run"]["seed"])
    check = warm_start_check(model, str(env["id"]), kwargs, words, 64, seed, dict(ws.get("demo", {})))
    write_json(Path(out_dir) / "warm_check.json", check)
    return str(model), check


def _run_job(cfg: dict[str, Any], run_dir: str) -> tuple[list[dict[str, Any]], float]:
    _worker_init()
    return train_run(cfg, Path(run_dir))


def _worker_init() -> None:
    """Each bench process: one torch thread, bench algorithms registered, and a free rendezvous port of its own
    (a port the parent picked for an earlier in-process run would clash between parallel workers)."""
    import os

    import torch.distributed

    if not torch.distributed.is_initialized() and os.environ.get("SAO_BENCH_WORKER") == "1":
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
    tiny_model_threads(1)
    register_bench_algorithms()


Plan = list[tuple[str, str, int, int]]
"""(task, variant, seed, steps) of every run, in order."""
WarmCall = tuple[dict[str, Any], dict[str, Any], str]
"""A ``_warm_job``'s arguments: the family's run config, its ``warm_start`` spec, the output folder."""


def _check_selection(lc: LearningConfig, spec: dict[str, Any], task_names: tuple[str, ...]) -> None:
    bad_t = [n for n in task_names if n not in spec.get("tasks", {})]
    if bad_t:
        raise ValueError(f"unknown task(s) {bad_t}; {lc.config} defines {list(spec.get('tasks', {}))}")
    bad_v = [n for n in lc.variants if n not in spec.get("variants", {})]
    if bad_v:
        raise ValueError(f"unknown variant(s) {bad_v}; {lc.config} defines {list(spec.get('variants', {}))}")
    if not lc.seeds:
        raise ValueError("--seeds needs at least one seed, e.g. 0,1,2")
    if lc.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {lc.jobs}")


def _plan(
    lc: LearningConfig, spec: dict[str, Any], task_names: tuple[str, ...]
) -> tuple[dict[str, tuple[Path, int]], dict[tuple[str, int], WarmCall], Plan]:
    """Each family's tokenizer, the warm starts (one per family and seed) and the runs."""
    toks: dict[str, tuple[Path, int]] = {}
    warm_calls: dict[tuple[str, int], WarmCall] = {}
    plan: Plan = []
    for task in task_names:
        task_spec = spec["tasks"][task]
        fam_name = str(task_spec.get("family", task))
        family = spec.get("families", {}).get(fam_name, {})
        if fam_name not in toks:
            toks[fam_name] = make_tokenizer(family, lc.out / "families" / fam_name / "tokenizer")
        base_steps = int(merge(spec.get("base", {}), task_spec).get("run", {}).get("total_steps", 30))
        steps = max(1, math.ceil((lc.steps or base_steps) * lc.scale))
        for variant in task_variants(spec, task, lc.variants):
            for seed in lc.seeds:
                plan.append((task, variant, seed, steps))
                if family.get("warm_start") and (fam_name, seed) not in warm_calls:
                    ws = family["warm_start"]
                    wcfg = run_config(spec, task, variant, seed, steps, *toks[fam_name])
                    wcfg["env"] = dict(ws.get("env", wcfg["env"]))
                    out_dir = str(lc.out / "families" / fam_name / f"warm_seed{seed}")
                    warm_calls[(fam_name, seed)] = (wcfg, ws, out_dir)
    return toks, warm_calls, plan


def _warm_starts(
    lc: LearningConfig, warm_calls: dict[tuple[str, int], WarmCall], echo: Callable[[str], None]
) -> dict[tuple[str, int], tuple[str, dict[str, Any]]]:
    """(family, seed) -> (model dir, check) of every warm start, in ``lc.jobs`` workers."""
    keys = list(warm_calls)

    def warm_done(i: int, res: Any) -> None:
        c = res[1]
        echo(f"warm start {keys[i][0]} seed {keys[i][1]}: held-out p(right) {c['p_right']:.2f}, argmax right "
             f"{c['acc']:.2f}, entropy {c['entropy']:.2f} nats "
             + " ".join(f"[{r}: p {v['p_right']:.2f}]" for r, v in c["by_rule"].items()))  # fmt: skip

    return dict(zip(keys, map_in_workers(_warm_job, [warm_calls[k] for k in keys], lc.jobs, warm_done), strict=True))


def _runs(
    lc: LearningConfig, plan: Plan, calls: list[tuple[dict[str, Any], str]], t_all: float, echo: Callable[[str], None]
) -> list[tuple[list[dict[str, Any]], float]]:
    """Every planned run's (metrics rows, wall seconds), in ``lc.jobs`` workers."""

    def run_done(i: int, res: Any) -> None:
        task, variant, seed, _ = plan[i]
        n_done = sum(1 for r in results_seen if r) + 1
        results_seen[i] = True
        echo(
            f"[{n_done}/{len(plan)}] {task} {variant} seed {seed}: final success "
            f"{float(res[0][-1]['success_rate']) if res[0] else float('nan'):.2f}, {res[1]:.0f}s "
            f"(elapsed {time.perf_counter() - t_all:.0f}s)"
        )

    results_seen = [False] * len(plan)
    return map_in_workers(_run_job, calls, lc.jobs, run_done)


def _task_entry(
    lc: LearningConfig, spec: dict[str, Any], task: str, plan: Plan, cfgs: list[dict[str, Any]],
    results: list[tuple[list[dict[str, Any]], float]],
) -> dict[str, Any]:  # fmt: skip
    """One task's document: its label, claim, threshold, and each variant's summary and curves over the seeds."""
    task_spec = spec["tasks"][task]
    shift = None
    if task_spec.get("post_shift_steps"):
        shift = (int(task_spec["env"]["kwargs"]["shift_every"]), int(task_spec["post_shift_steps"]))
    threshold = float(task_spec.get("threshold", 0.5))
    entry: dict[str, Any] = {
        "label": task_spec.get("label", task),
        "claim": task_spec.get("claim", ""),
        "threshold": threshold,
        "variants": {},
    }
    for variant in task_variants(spec, task, lc.variants):
        idx = [i for i, p in enumerate(plan) if p[0] == task and p[1] == variant]
        curves = [run_curves(results[i][0]) for i in idx]
        s = summarize_runs(curves, threshold, lc.smooth, lc.final_frac, shift)
        s["wall_s_mean"] = sum(results[i][1] for i in idx) / len(idx)
        entry["variants"][variant] = {
            "label": spec["variants"][variant].get("label", variant),
            "uses_critic": _uses_critic(cfgs[idx[0]]),
            "summary": s,
            "curves": curves,
            "config": cfgs[idx[0]],
        }
    return entry


def run(lc: LearningConfig, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Every (task, variant, seed) run, the table, JSON + PNGs; returns the JSON document. With ``lc.jobs`` > 1
    the warm starts, then the runs, go to that many worker processes (one torch thread each)."""
    spec = merge(load_yaml(lc.config, SPEC_HINT), lc.overrides)
    task_names = lc.tasks or tuple(spec.get("tasks", {}))
    _check_selection(lc, spec, task_names)
    tiny_model_threads(1)
    register_bench_algorithms()
    lc.out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"benchmark": "learning", "seeds": list(lc.seeds), "smooth": lc.smooth, "tasks": {},
                           "jobs": lc.jobs, "warm_starts": {}}  # fmt: skip
    t_all = time.perf_counter()
    toks, warm_calls, plan = _plan(lc, spec, task_names)
    warm = _warm_starts(lc, warm_calls, echo)
    doc["warm_starts"] = {f"{f}/seed{s}": {"model": m, "check": c} for (f, s), (m, c) in warm.items()}
    calls, cfgs = [], []
    for task, variant, seed, steps in plan:
        fam_name = str(spec["tasks"][task].get("family", task))
        model_path = warm[(fam_name, seed)][0] if (fam_name, seed) in warm else None
        cfg = run_config(spec, task, variant, seed, steps, *toks[fam_name], model_path)
        cfgs.append(cfg)
        calls.append((cfg, str(lc.out / "runs" / task / f"{variant}_seed{seed}")))
    results = _runs(lc, plan, calls, t_all, echo)
    for task in task_names:
        doc["tasks"][task] = _task_entry(lc, spec, task, plan, cfgs, results)
    doc["total_wall_s"] = time.perf_counter() - t_all
    _print_summary(doc, echo)
    write_json(lc.out / "learning.json", doc)
    pngs = [plot_success(doc, lc.out / "success_vs_step.png"), plot_dynamics(doc, lc.out / "dynamics.png")]
    echo(f"\nwrote {lc.out / 'learning.json'} and {', '.join(str(p) for p in pngs)}")
    return doc


def _fmt(x: float, digits: int = 2) -> str:
    return "—" if not math.isfinite(x) else f"{x:.{digits}f}"


def _print_summary(doc: dict[str, Any], echo: Callable[[str], None]) -> None:
    headers = ["task", "variant", "final success", "reached", "steps to thr", "final EV", "post-shift", "s/run"]
    rows = []
    for task in doc["tasks"].values():
        for res in task["variants"].values():
            s = res["summary"]
            post = s.get("post_shift_success_mean", float("nan"))
            rows.append(
                [
                    f"{task['label']} (thr {task['threshold']:g})",
                    res["label"],
                    f"{_fmt(s['final_success_mean'])} ± {_fmt(s['final_success_std'])}",
                    f"{s['reached']}/{s['seeds']}",
                    _fmt(s["steps_to_threshold_mean"], 1),
                    _fmt(s["final_explained_variance_mean"]) if res["uses_critic"] else "n/a",
                    f"{_fmt(post)} ± {_fmt(s.get('post_shift_success_std', float('nan')))}"
                    if math.isfinite(post)
                    else "n/a",
                    f"{s['wall_s_mean']:.0f}",
                ]
            )
    echo("")
    print_table(headers, rows, echo)
