"""Policy versions across resumes: never reused, and the distance between two of them along the run's branches.

A resume restores the checkpoint of version ``N`` and goes on under a fresh id ``M``, one above every version the
run ever used (its ledger says which, ``sao.trainer.rollout.ledger.replay``): ``M`` is an alias of ``N`` (the same
weights), and the ids between them belong to the branch the resume discarded. So no version id is ever given to two
sets of weights, and the ids fall into segments of consecutive policy updates, each starting at 0 or at a resume's
``M``. The lag of a trajectory is the number of policy updates between the weights that sampled it and the current
ones along this tree: for a trajectory of a discarded branch, its updates past the fork plus the current branch's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Lineage:
    """``aliases``: the first version id of each resumed segment -> the version whose checkpoint it resumed."""

    aliases: Mapping[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for start, base in self.aliases.items():
            if not 0 <= base < start:
                raise ValueError(f"a resumed segment starts above the version it resumed: got {start} -> {base}")

    def _segment(self, v: int) -> int:
        """The first id of ``v``'s segment (0 for the run's first one)."""
        return max((s for s in self.aliases if s <= v), default=0)

    def depth(self, v: int) -> int:
        """Policy updates from the initial weights to version ``v`` along its own branch."""
        s = self._segment(v)
        return v - s + (self.depth(self.aliases[s]) if s in self.aliases else s)

    def _tops(self, u: int) -> dict[int, int]:
        """Segment start -> the highest id of that segment on ``u``'s branch (``u`` and its ancestors)."""
        out: dict[int, int] = {}
        while True:
            s = self._segment(u)
            out[s] = u
            if s not in self.aliases:
                return out
            u = self.aliases[s]

    def distance(self, v: int, u: int) -> int:
        """Policy updates between version ``v`` (the weights that sampled a trajectory) and ``u`` (the current ones)
        along the tree of branches: through their last common version."""
        tops = self._tops(u)
        x = v
        while (s := self._segment(x)) not in tops:
            x = self.aliases[s]  # the first segment (start 0) is on every branch, so this ends
        fork = min(x, tops[s])
        return self.depth(v) - self.depth(fork) + self.depth(u) - self.depth(fork)
