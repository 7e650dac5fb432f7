"""The critic as a predictor, on a staged run's held-out eval episodes: its value at each episode's first action token
(its guess of the return from the prompt alone) against the episode's outcome, per difficulty level (a calibration
table and ``plots/critic_calibration.png``), and its explained variance over every action token of those episodes.

The episodes are an eval stage's (held-out tasks no critic ever fit): the value pretraining stage probes its critic
on the eval after SFT (the policy it fitted), and the eval after RL probes both that critic and RL's final one on its
own episodes, so the two are read side by side on the same episodes.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from sao.agent.records import Trajectory
from sao.trainer.config import Config

LEVEL_NONE = "all"
"""The group of episodes whose task has no difficulty level."""


@torch.no_grad()
def first_action_values(
    critic: Any,
    trajs: list[Trajectory],
    pad_id: int,
    batch_size: int = 8,
    gamma: float = 1.0,
    positions: str = "token",
    value_range: Sequence[float] | None = None,
) -> tuple[list[float], float]:
    """The critic's value at each trajectory's first action token (the state after the prompt), in order, and its
    explained variance over every action token against the Monte-Carlo returns (lambda = 1, skip-observation: what
    value pretraining fits and reports), from one forward per batch. ``positions`` (``critic.value_positions``):
    under ``turn`` each action token is read at its turn's start, as RL reads it; ``value_range``
    (``critic.value_range``): clamped as RL reads them."""
    from sao.trainer.algos.losses import explained_variance_from_sums, explained_variance_sums
    from sao.trainer.algos.registry import get_advantage
    from sao.trainer.learn.batch import collate
    from sao.trainer.learn.models import shifted_values
    from sao.trainer.learn.targets import value_after, value_targets, values_as_read

    returns_of = get_advantage("skip_obs_gae")
    out: list[float] = []
    sums = [0.0] * 5
    for s in range(0, len(trajs), batch_size):
        b = collate(trajs[s : s + batch_size], pad_id)
        raw = critic(b.input_ids, b.attention_mask, b.position_ids).float()
        values = values_as_read(shifted_values(raw), b, positions, value_range)
        after = value_after(raw, b, value_range)
        returns = value_targets(returns_of, b, torch.zeros_like(b.rewards), after, gamma, 1.0)
        sums = [x + y for x, y in zip(sums, explained_variance_sums([values], [returns], [b.action_mask]), strict=True)]
        for r in range(values.shape[0]):
            out.append(float(values[r, int(b.action_mask[r].nonzero()[0])]))
    return out, explained_variance_from_sums(sums)


def calibration_by_level(trajs: list[Trajectory], values: list[float]) -> dict[str, dict[str, float]]:
    """Per difficulty level (``info["level"]``; ``all`` for episodes without one): episodes, the critic's mean value
    at the first action token, the empirical success and mean return, and the first-action explained variance
    ``1 - Var(R - V0) / Var(R)`` over every episode (key ``overall``)."""
    groups: dict[str, list[tuple[float, float, bool]]] = {}
    for t, v in zip(trajs, values, strict=True):
        level = t.info.get("level")
        key = str(level) if level is not None else LEVEL_NONE
        groups.setdefault(key, []).append((v, t.reward, bool(t.info.get("solved", t.reward > 0))))
    out = {
        k: {
            "episodes": len(g),
            "mean_value": sum(v for v, _, _ in g) / len(g),
            "success": sum(s for _, _, s in g) / len(g),
            "mean_return": sum(r for _, r, _ in g) / len(g),
        }
        for k, g in sorted(groups.items())
    }
    rets = [t.reward for t in trajs]
    out["overall"] = {"episodes": len(trajs), "first_action_ev": _ev(values, rets)}
    return out


def _ev(values: list[float], returns: list[float]) -> float:
    n = len(returns)
    if n < 2:
        return math.nan
    mean_r = sum(returns) / n
    var_r = sum((r - mean_r) ** 2 for r in returns) / n
    err = [r - v for v, r in zip(values, returns, strict=True)]
    mean_e = sum(err) / n
    return 1.0 - (sum((e - mean_e) ** 2 for e in err) / n) / var_r if var_r > 1e-12 else math.nan


def probe_critic(cfg: Config, critic_init: str, trajs: list[Trajectory]) -> dict[str, Any]:
    """Load the critic ``critic_init`` (``actor``: the critic RL would start from without value pretraining) and
    measure it on ``trajs``: per-token explained variance against the returns, and the calibration by level."""
    from sao.trainer.learn.models import load_actor, load_critic, load_tokenizer

    c = copy.deepcopy(cfg)
    c.critic.init = critic_init
    pad_id = int(load_tokenizer(c).pad_token_id)
    actor = load_actor(c)
    critic = load_critic(c, actor).eval()
    del actor
    values, ev = first_action_values(
        critic, trajs, pad_id, c.trainer.batch_size, c.trainer.gamma, c.critic.value_positions, c.critic.value_range
    )
    return {"critic": critic_init, "explained_variance": ev, "by_level": calibration_by_level(trajs, values)}


def calibrate(cfg: Config, critics: dict[str, str], eval_dir: Path) -> dict[str, Any]:
    """``probe_critic`` of each ``{label: critic dir or "actor"}`` on the episodes of the eval stage in ``eval_dir``."""
    from sao.trainer.learn.value_pretrain import read_rollouts

    trajs = read_rollouts(eval_dir / "trajectories.jsonl")
    return {
        "episodes_from": str(eval_dir),
        "critics": {label: probe_critic(cfg, init, trajs) for label, init in critics.items()},
    }


def calibration_table(calibrations: list[dict[str, Any]]) -> str:
    """One Markdown row per critic probed: which eval's episodes it read (the stage folder: one critic is often
    probed on the eval after SFT and again on the eval after RL), per level the mean first-action value against the
    success, then the per-token and first-action explained variance. Empty without calibrations."""
    rows = [(label, Path(cal["episodes_from"]).name, p) for cal in calibrations for label, p in cal["critics"].items()]
    if not rows:
        return ""
    levels = sorted({k for _, _, p in rows for k in p["by_level"] if k != "overall"})
    lines = [
        "| critic | episodes of | "
        + " | ".join(f"level {k}: V0 / success" for k in levels)
        + " | EV (tokens) | EV (first action) |",
        "|---|---|" + "---|" * (len(levels) + 2),
    ]
    for label, stage, p in rows:
        cells = []
        for k in levels:
            g = p["by_level"].get(k)
            cells.append(f"{g['mean_value']:.2f} / {g['success']:.2f} (n={g['episodes']})" if g else "-")
        ev0 = p["by_level"]["overall"]["first_action_ev"]
        lines.append(f"| {label} | {stage} | " + " | ".join(cells) + f" | {_f(p['explained_variance'])} | {_f(ev0)} |")
    return "\n".join(lines)


def _f(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.3f}"


def plot_calibration(path: Path, calibrations: list[dict[str, Any]]) -> Path:
    """Mean first-action value per level of each critic probed, with each eval's empirical success per level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    top = 1.05  # a critic may overshoot 1 (values are not clipped): the axis shows it
    for cal in calibrations:
        success_drawn = False
        for label, p in cal["critics"].items():
            levels = sorted(k for k in p["by_level"] if k != "overall")
            xs = list(range(len(levels)))
            if not success_drawn:
                ys = [p["by_level"][k]["success"] for k in levels]
                ax.plot(xs, ys, "k--o", label=f"success ({Path(cal['episodes_from']).name})")
                success_drawn = True
            values = [p["by_level"][k]["mean_value"] for k in levels]
            top = max([top, *(v + 0.05 for v in values)])
            ax.plot(xs, values, marker="s", label=f"V0: {label} ({Path(cal['episodes_from']).name})")
            ax.set_xticks(xs, [f"level {k}" for k in levels])
    ax.set_ylim(-0.05, top)
    ax.set_ylabel("success / critic value at the first action")
    ax.set_title("critic calibration on held-out eval episodes")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
