"""Trajectory records: the token-exact output of an episode, tagged prompt / action / observation."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

SegmentKind = Literal["prompt", "action", "observation"]
TrajectoryStatus = Literal["ok", "truncated", "infra_error"]
_KINDS = ("prompt", "action", "observation")
_STATUSES = ("ok", "truncated", "infra_error")


@dataclass(frozen=True)
class Segment:
    """A run of tokens of one kind.

    ``logprobs`` (one per token, as reported by the inference engine while sampling) and ``policy_version``
    (the weights version that sampled them) are set on action segments only. ``reward`` is an optional
    per-turn reward placed on this action segment's last token.
    """

    kind: SegmentKind
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None = None
    policy_version: int | None = None
    reward: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"Segment.kind must be one of {_KINDS}, got {self.kind!r}")
        object.__setattr__(self, "token_ids", tuple(int(t) for t in self.token_ids))
        if self.kind == "action":
            if self.logprobs is None or self.policy_version is None:
                raise ValueError("an action Segment needs logprobs and policy_version (from the engine)")
            object.__setattr__(self, "logprobs", tuple(float(x) for x in self.logprobs))
            if len(self.logprobs) != len(self.token_ids):
                raise ValueError(f"action Segment has {len(self.token_ids)} tokens but {len(self.logprobs)} logprobs")
        elif self.logprobs is not None or self.policy_version is not None or self.reward is not None:
            raise ValueError(f"a {self.kind} Segment carries no logprobs, policy_version or reward")

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "token_ids": list(self.token_ids),
            "logprobs": None if self.logprobs is None else list(self.logprobs),
            "policy_version": self.policy_version,
            "reward": self.reward,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Segment:
        lp = d.get("logprobs")
        return cls(
            kind=d["kind"],
            token_ids=tuple(d["token_ids"]),
            logprobs=None if lp is None else tuple(lp),
            policy_version=d.get("policy_version"),
            reward=d.get("reward"),
        )


@dataclass(frozen=True)
class Trajectory:
    """One episode: its segments in order, the final reward and how it ended.

    ``status="infra_error"`` means the infrastructure failed (sandbox, grader, engine); such a trajectory is
    kept on disk and counted but never trained on, and has no outcome: it is written with ``"reward": null``
    (``reward`` is 0.0 in memory, a placeholder nothing trains on). ``reward`` is the episode's total reward: the
    sum of the per-turn ``Segment.reward`` values plus any part no turn carries (the trainer puts that rest on the
    last action token). ``info`` holds env info (grading report, truncation reason); ``timings`` holds seconds
    spent per phase (``engine_s``, ``env_s``, ``total_s``). ``group_id`` names the rollout group (the episodes of
    one prompt that a grouped algorithm such as GRPO compares with each other); None for a single rollout.
    """

    task_id: str
    env_id: str
    segments: tuple[Segment, ...]
    reward: float
    status: TrajectoryStatus = "ok"
    info: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    group_id: int | None = None

    def __post_init__(self) -> None:
        if self.group_id is not None:
            object.__setattr__(self, "group_id", int(self.group_id))
        if self.status not in _STATUSES:
            raise ValueError(f"Trajectory.status must be one of {_STATUSES}, got {self.status!r}")
        object.__setattr__(self, "segments", tuple(self.segments))

    @property
    def token_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments)

    @property
    def action_segments(self) -> list[Segment]:
        return [s for s in self.segments if s.kind == "action"]

    @property
    def bootstraps(self) -> bool:
        """Whether the episode's return is incomplete, so GAE bootstraps from V after its last action (the one rule
        for the end of an episode). Complete, i.e. terminal for GAE: a terminated episode (``status="ok"``); a cut
        (``status="truncated"``) the env graded when it ended it (``info["graded"]`` True: the SWE env grades the
        repository whenever an episode ends, so its return is all there); an ending the policy caused
        (``truncation_reason="format_errors"``), graded or not. Only a cut nothing graded (``info["graded"]`` False:
        reward may still be to come) bootstraps. A record written before ``graded`` existed counts as complete:
        the return it holds is taken as final, as plain Monte-Carlo returns always took it, rather than adding a
        critic estimate the data never earned."""
        if self.status != "truncated" or self.info.get("truncation_reason") == "format_errors":
            return False
        return self.info.get("graded", True) is False

    @property
    def oldest_policy_version(self) -> int | None:
        versions = [s.policy_version for s in self.action_segments if s.policy_version is not None]
        return min(versions) if versions else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["segments"] = [s.to_dict() for s in self.segments]
        if self.status == "infra_error":
            d["reward"] = None  # an outcome nobody gave is never written as a reward
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        return cls(
            task_id=str(d["task_id"]),
            env_id=str(d["env_id"]),
            segments=tuple(Segment.from_dict(s) for s in d["segments"]),
            reward=_reward(d),
            status=d.get("status", "ok"),
            info=dict(d.get("info") or {}),
            timings=dict(d.get("timings") or {}),
            group_id=d.get("group_id"),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=str)

    @classmethod
    def from_json(cls, line: str) -> Trajectory:
        return cls.from_dict(json.loads(line))


def _reward(d: dict[str, Any]) -> float:
    """A record's reward; null only on an infra error (no outcome), read as the placeholder 0.0."""
    if d["reward"] is None:
        if d.get("status") != "infra_error":
            raise ValueError(f"reward null with status {d.get('status', 'ok')!r}: only an infra_error has no outcome")
        return 0.0
    return float(d["reward"])


def write_jsonl(path: str | Path, trajectories: Iterable[Trajectory], append: bool = True) -> None:
    """Append trajectories to a JSONL file, fsynced so a crash loses nothing already written (a line a crash tore
    is set aside first, ``sao.core.jsonl``); ``append=False`` replaces the file atomically."""
    from sao.core.jsonl import append_jsonl, write_text_durably

    if not append:
        write_text_durably(path, "".join(t.to_json() + "\n" for t in trajectories))
        return
    append_jsonl(path, (t.to_dict() for t in trajectories))


def read_jsonl(path: str | Path) -> Iterator[Trajectory]:
    """Read trajectories from JSONL; a malformed line raises a ValueError naming the file and line number."""
    from sao.core.jsonl import iter_jsonl

    for n, rec in iter_jsonl(path, fix="was it written by SAO?"):
        try:
            yield Trajectory.from_dict(rec)
        except (KeyError, ValueError, TypeError, AttributeError) as e:
            raise ValueError(f"{path}:{n}: not a Trajectory record ({e}); was it written by SAO?") from e
