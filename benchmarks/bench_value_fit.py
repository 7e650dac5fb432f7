"""`sao bench value-fit`: what the critic's gradient clip, learning rate, target lambda and the number of rollouts
it is fitted on do to value pretraining, side by side in one run on the same rollouts: held-out explained variance
and the gradient norm per epoch, per setting.

Each setting fits a fresh critic (``sao.trainer.learn.value_pretrain.fit_critic``, the ``pretrain_value`` stage's own
code) on the same fit/held-out split of the rollouts (whole tasks held out), so the rows differ only in the setting.
``rollouts`` may name several files (e.g. a run's value-pretraining rollouts and its RL trajectories): they are
pooled before the split. ``sizes`` fits on the first N of the fit side (shuffled once by the run's seed, so a
smaller fit set is part of every larger one) against the same held-out tasks: whether more rollouts would warm the
critic, measured rather than guessed. ``held_out`` names a separate file of held-out trajectories instead (e.g. the
eval after SFT: the same policy on tasks the fit never saw, more episodes than a quarter of the fit's own); every
rollout is then on the fit side, and a task on both sides is an error.
"""

from __future__ import annotations

import copy
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sao.agent.records import Trajectory
from sao.core.config import ConfigError
from sao.core.jsonl import write_json_atomic
from sao.trainer.config import load_config
from sao.trainer.learn.value_pretrain import fit_critic, read_rollouts, split_by_task


@dataclass(frozen=True)
class ValueFitConfig:
    config: str
    rollouts: str
    out: Path
    clips: tuple[float, ...] = (1.0, 10.0)
    lrs: tuple[float, ...] = ()
    epochs: int = 4
    holdout: float = 0.25
    overrides: tuple[str, ...] = ()
    sizes: tuple[int, ...] = ()
    """Fit-set sizes to compare (trajectories; empty: all of the fit side)."""
    lams: tuple[float, ...] = (1.0,)
    """Lambdas of the fit's targets (1: Monte-Carlo returns; below 1: TD(lambda) on the critic's own values)."""
    held_out: str = ""
    """Held-out trajectories from their own file(s) (``a,b``) instead of a ``holdout`` share of ``rollouts``."""
    head_fits: tuple[str, ...] = ()
    """``pretrain_value.head_fit`` values to compare (``ridge``, ``none``; empty: the config's)."""
    value_positions: tuple[str, ...] = ()
    """``critic.value_positions`` to compare (``token``, ``turn``; empty: the config's)."""
    probe: bool = False
    """Probe each fitted critic on the held-out trajectories (``sao.trainer.runs.critic_probe``): the explained
    variance of the values the advantages read over every action token, and the value at the first action per
    level: one figure every row shares, whatever positions its fit trained."""


def _sizes(vc: ValueFitConfig, n_fit: int) -> list[int]:
    bad = [n for n in vc.sizes if n < 1 or n > n_fit]
    if bad:
        raise ConfigError(
            f"--sizes {','.join(map(str, bad))}: the fit side has {n_fit} trajectories after holding out "
            f"{vc.holdout:g} of the tasks; give sizes from 1 to {n_fit}"
        )
    return list(vc.sizes) or [n_fit]


def _read(paths: str) -> list[Trajectory]:
    return [t for path in paths.split(",") if path.strip() for t in read_rollouts(path.strip())]


def fit_and_held_out(vc: ValueFitConfig, seed: int) -> tuple[list[Trajectory], list[Trajectory]]:
    """The fit side and the held-out side: a ``holdout`` share of the rollouts' tasks, or ``held_out``'s file."""
    trajs = _read(vc.rollouts)
    if not vc.held_out:
        return split_by_task(trajs, vc.holdout, seed)
    held = _read(vc.held_out)
    shared = {t.task_id for t in trajs} & {t.task_id for t in held}
    if shared:
        raise ConfigError(
            f"--held-out {vc.held_out}: {len(shared)} of its tasks are in --rollouts too (e.g. "
            f"{sorted(shared)[0]!r}); held-out tasks must be ones the fit never saw (e.g. the eval after SFT, "
            "whose tasks are drawn apart from training's)"
        )
    if not held:
        raise ConfigError(f"--held-out {vc.held_out}: no trajectory with actions in it")
    return trajs, held


def run(vc: ValueFitConfig, echo: Any = print) -> dict[str, Any]:
    cfg = load_config(vc.config, list(vc.overrides))
    fit, held = fit_and_held_out(vc, cfg.run.seed)
    random.Random(cfg.run.seed).shuffle(fit)
    lrs = vc.lrs or ((cfg.pretrain_value.lr or cfg.critic.lr),)
    rows: list[dict[str, Any]] = []
    load0 = os.getloadavg()[0]
    heads = vc.head_fits or (cfg.pretrain_value.head_fit,)
    positions = vc.value_positions or (cfg.critic.value_positions,)
    grid = [
        (n, lam, lr, clip, head, pos)
        for n in _sizes(vc, len(fit)) for lam in vc.lams for lr in lrs for clip in vc.clips for head in heads
        for pos in positions
    ]  # fmt: skip
    for size, lam, lr, clip, head, pos in grid:
        c = copy.deepcopy(cfg)
        c.critic.gradient_clipping = clip
        c.pretrain_value.head_fit = head
        c.critic.value_positions = pos
        c.validate()
        t0 = time.perf_counter()
        where = vc.out / f"critic_n{size}_lam{lam:g}_lr{lr:g}_clip{clip:g}_head-{head}_at-{pos}"
        res = fit_critic(c, fit[:size], held, vc.epochs, lr, where, lam=lam)
        row = {"size": size, "lam": lam, "lr": lr, "clip": clip, "head": head, "positions": pos, **res}
        if vc.probe:
            from sao.trainer.runs.critic_probe import probe_critic

            row["probe"] = probe_critic(c, str(where), held)
        rows.append({**row, "wall_s": time.perf_counter() - t0})
        echo(
            f"{size} rollouts, lambda {lam:g}, lr {lr:g} clip {clip:g}, head {head}, at {pos}: held-out EV "
            f"{res['held_out_ev_before']:.3f} -> {_start_ev(res):.3f} (head fit) -> {res['held_out_ev_after']:.3f}, "
            f"grad norm {_last_grad_norm(res):.2f}" + (f"; probe {_probe_text(row['probe'])}" if vc.probe else "")
        )
    doc = {
        "config": vc.config, "rollouts": vc.rollouts, "held_out_file": vc.held_out or None,
        "fit": len(fit), "held_out": len(held), "epochs": vc.epochs,
        "held_out_tasks": len({t.task_id for t in held}), "load_avg_start": load0, "load_avg_end": os.getloadavg()[0],
        "rows": rows,
    }  # fmt: skip
    vc.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(vc.out / "value_fit.json", doc)
    echo(table(doc))
    plot(doc, vc.out / "value_fit.png")
    return doc


def _start_ev(row: dict[str, Any]) -> float:
    """The held-out EV the gradient steps start from: after the head's fit where there was one."""
    head = row.get("head_fit") or {}
    return float(head.get("held_out_ev", row["held_out_ev_before"]))


def _last_grad_norm(row: dict[str, Any]) -> float:
    """The last epoch's mean gradient norm; NaN for a fit of 0 epochs (the head fit alone)."""
    return float(row["curve"][-1]["grad_norm"]) if row["curve"] else math.nan


def _probe_text(probe: dict[str, Any] | None) -> str:
    """The probe's figures for a table cell: EV over the action tokens, at the first action, V0 by level."""
    if not probe:
        return "-"
    by = probe["by_level"]
    levels = " / ".join(f"{by[k]['mean_value']:.2f}" for k in sorted(by) if k != "overall")
    return (
        f"EV {probe['explained_variance']:.3f}, first action {by['overall']['first_action_ev']:.3f}, "
        f"V0 by level {levels}"
    )


def table(doc: dict[str, Any]) -> str:
    lines = [
        f"value fit on {doc['fit']} rollouts, {doc['held_out']} held out (load {doc['load_avg_start']:.1f} -> "
        f"{doc['load_avg_end']:.1f})",
        "| fit rollouts | target lambda | critic lr | grad clip | head fit | value positions | held-out EV before "
        "| after the head fit | held-out EV after | grad norm (last epoch) | probe (held out) | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        lines.append(
            f"| {r.get('size', doc['fit'])} | {r.get('lam', 1.0):g} | {r['lr']:g} | {r['clip']:g} | "
            f"{r.get('head', 'none')} | {r.get('positions', 'token')} | {r['held_out_ev_before']:.3f} | "
            f"{_start_ev(r):.3f} | {r['held_out_ev_after']:.3f} | {_last_grad_norm(r):.2f} | "
            f"{_probe_text(r.get('probe'))} | {r['wall_s']:.0f} |"
        )
    return "\n".join(lines)


def plot(doc: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(9, 3.4))
    for r in doc["rows"]:
        size, lam = r.get("size", doc["fit"]), r.get("lam", 1.0)
        label = (
            f"{size} rollouts, lambda {lam:g}, lr {r['lr']:g}, clip {r['clip']:g}, head {r.get('head', 'none')}, "
            f"at {r.get('positions', 'token')}"
        )
        epochs = [0] + [c["epoch"] for c in r["curve"]]
        ax[0].plot(epochs, [_start_ev(r)] + [c["held_out_ev"] for c in r["curve"]], marker=".", label=label)
        ax[1].plot([c["epoch"] for c in r["curve"]], [c["grad_norm"] for c in r["curve"]], marker=".", label=label)
    ax[0].axhline(0.0, color="grey", lw=0.8)
    ax[0].set_title("held-out explained variance (epoch 0: after the head fit)")
    ax[1].set_title("critic gradient norm (before the clip)")
    for a in ax:
        a.set_xlabel("epoch")
    ax[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
