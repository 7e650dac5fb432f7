"""The commands rank 0 sends every trainer rank, as frozen records (``Trainer.lead`` broadcasts one, every rank
executes it in the same order, ``Trainer.execute`` dispatches on its type in one place).

With one rank nothing is serialized: the record, trajectories included, is passed as it is; with several,
``torch.distributed.broadcast_object_list`` pickles it once per command.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sao.agent.engines.weight_sync import SyncPlan
from sao.agent.records import Trajectory

if TYPE_CHECKING:
    from sao.trainer.rollout.pipeline import Item


@dataclass(frozen=True)
class Train:
    """One learner step on ``trajs``; ``policy=False``: a critic warm-up batch (the critic's K steps only).
    ``episodes``: the episode (0, 1, ...) of each row (an episode's rows share its outcome and, under GRPO, its one
    advantage); empty: every row an episode of its own."""

    trajs: tuple[Trajectory, ...]
    policy: bool = True
    episodes: tuple[int, ...] = ()

    @classmethod
    def of(cls, items: Sequence[Item], policy: bool = True) -> Train:
        """The step on a coordinator batch: every row of each episode in order."""
        return cls(
            tuple(r for i in items for r in i.rows), policy, tuple(e for e, i in enumerate(items) for _ in i.rows)
        )


@dataclass(frozen=True)
class Save:
    """Write this rank's part of a resumable checkpoint into ``dir`` (the run folder's partial folder)."""

    dir: str


@dataclass(frozen=True)
class Export:
    """Write the actor (or with ``critic``, the critic) as a loadable model dir on rank 0."""

    dir: str
    critic: bool = False


@dataclass(frozen=True)
class PushWeights:
    """Broadcast the actor's weights to the inference engines over the group ``plan`` names."""

    plan: SyncPlan


@dataclass(frozen=True)
class Stop:
    """The last command: ranks > 0 return from ``follow``; ``run_dir`` receives the parameter digest if asked.
    ``reason``: why the run stopped before its last step (``trainer.runs.stopping``), None when it finished; every rank
    then exits with ``exit_code``."""

    run_dir: str
    reason: str | None = None
    exit_code: int = 0


@dataclass(frozen=True)
class Saved:
    """What ``Save`` gives back: ``saved`` False with no ``error``: the weights were not finite (not written)."""

    saved: bool
    error: str | None = None


Command = Train | Save | Export | PushWeights | Stop
