"""The episodes of one ``trajectories.jsonl`` as summaries, and the filter / sort / page over them (pure logic).

A file holds plain trajectory lines (`sao eval`, `sao collect`, a staged run's collect and eval, `sao serve
--gateway`) or a training run's ledger (``type`` lines: a trajectory as it arrived, then the step that trained it or
dropped it, and resume records that void later events; ``sao.trainer.rollout.ledger``). ``EpisodeTable.add`` folds
either kind of line, in file order, into one ``Episode`` summary per trajectory; the records themselves stay on disk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

ENDINGS = ("ok", "truncated", "graded_cut", "infra_error")
"""How an episode ended: terminated (ok), cut with reward still to come (truncated), cut and graded by the env at
the cut (graded_cut), or failed by the infrastructure (infra_error: never trained on)."""
SORT_KEYS = ("line", "step", "task_id", "reward", "turns", "tokens", "action_tokens", "lag", "rows", "prefix_breaks")


@dataclass(slots=True)
class Episode:
    """One trajectory (one row of an episode) as the list shows it. ``line``: its line among the file's JSON lines."""

    line: int
    uid: str | None
    task_id: str
    env_id: str
    reward: float | None
    status: str
    ending: str
    solved: bool | None
    turns: int
    tokens: int
    action_tokens: int
    row: int
    rows: int
    prefix_breaks: int
    oldest_version: int | None
    newest_version: int | None
    episode: str = ""
    """The episode this row belongs to: a training ledger's episode uid, else the runner's episode index."""
    fate: str = ""
    """Training runs: trained / dropped_stale / pending (infra errors are never trained); empty elsewhere."""
    step: int | None = None
    lag: int | None = None
    """Versions between the oldest turn's weights and the version the step trained."""


def ending(status: str, info: dict[str, Any]) -> str:
    if status == "truncated" and info.get("graded"):
        return "graded_cut"
    return status if status in ENDINGS else "ok"


def summarize(line: int, traj: dict[str, Any], uid: str | None = None) -> Episode:
    """The summary of a trajectory record (``Trajectory.to_dict``)."""
    info = traj.get("info") or {}
    segs = traj.get("segments") or []
    actions = [s for s in segs if s.get("kind") == "action"]
    versions = [int(s["policy_version"]) for s in actions if s.get("policy_version") is not None]
    status = str(traj.get("status", "ok"))
    reward = traj.get("reward")
    solved = info.get("solved")
    return Episode(
        line=line, uid=uid, task_id=str(traj.get("task_id", "")), env_id=str(traj.get("env_id", "")),
        reward=None if reward is None else float(reward), status=status, ending=ending(status, info),
        solved=None if solved is None else bool(solved), turns=int(info.get("turns") or len(actions)),
        tokens=sum(len(s.get("token_ids") or ()) for s in segs),
        action_tokens=sum(len(s.get("token_ids") or ()) for s in actions), row=int(info.get("row", 0) or 0),
        rows=int(info.get("rows", 1) or 1), prefix_breaks=int(info.get("prefix_breaks", 0) or 0),
        oldest_version=min(versions) if versions else None, newest_version=max(versions) if versions else None,
        episode=str(info.get("episode", "")),
    )  # fmt: skip


@dataclass
class EpisodeTable:
    """Every episode of one file, in file order, with a training ledger's fates folded in."""

    episodes: list[Episode] = field(default_factory=list)
    by_uid: dict[str, int] = field(default_factory=dict)
    ledger: bool = False
    changes: int = 0  #: lines folded in so far: a selection made at the same count is still valid

    def add(self, line: int, rec: dict[str, Any]) -> None:
        """Fold one line (its number among the JSON lines, and its record) into the table."""
        self.changes += 1
        kind = rec.get("type")
        if kind is None and "segments" in rec:
            self.episodes.append(summarize(line, rec))
        elif kind == "trajectory":
            self.ledger = True
            ep = summarize(line, rec.get("trajectory") or {}, uid=str(rec.get("uid")))
            ep.episode = str(rec.get("episode") or rec.get("uid"))
            ep.fate = "" if ep.status == "infra_error" else "pending"
            self.by_uid[str(rec.get("uid"))] = len(self.episodes)
            self.episodes.append(ep)
        elif kind == "event":
            self._event(rec)
        elif kind == "resume":  # a resumed run: what later steps did on the lost branch is void
            cut = int(rec.get("from_step", 0))
            for ep in self.episodes:
                if ep.step is not None and ep.step > cut:
                    ep.fate, ep.step, ep.lag = "pending", None, None

    def _event(self, rec: dict[str, Any]) -> None:
        i = self.by_uid.get(str(rec.get("uid")))
        if i is None:
            return
        ep = self.episodes[i]
        ep.fate, ep.step = str(rec.get("event", "")), int(rec.get("step", 0))
        version = rec.get("version")
        if version is not None and ep.oldest_version is not None:
            ep.lag = int(version) - ep.oldest_version


@dataclass(frozen=True)
class Query:
    """A filter, a sort and a page of the episode list. ``step``: ``N`` or ``A-B`` (trained at); ``task``: a
    substring of the task or env id; ``recorded``: only episodes with per-token records."""

    ending: str = ""
    fate: str = ""
    task: str = ""
    step: str = ""
    reward_min: float | None = None
    reward_max: float | None = None
    recorded: bool = False
    sort: str = "line"
    desc: bool = False
    offset: int = 0
    limit: int = 50


def _step_range(text: str) -> tuple[int, int] | None:
    text = text.strip()
    if not text:
        return None
    lo, _, hi = text.partition("-")
    try:
        return int(lo), int(hi or lo)
    except ValueError as e:
        raise ValueError(f"step filter {text!r}: write a step (3) or a range (2-5)") from e


def select(eps: Iterable[Episode], q: Query, recorded: Callable[[Episode], bool] = lambda e: False) -> list[Episode]:
    """The episodes that pass ``q``'s filters, sorted by ``q.sort`` (missing values last), unpaged."""
    if q.sort not in SORT_KEYS:
        raise ValueError(f"sort {q.sort!r}: one of {', '.join(SORT_KEYS)}")
    steps = _step_range(q.step)
    task = q.task.lower()
    out = [
        e
        for e in eps
        if (not q.ending or e.ending == q.ending)
        and (not q.fate or e.fate == q.fate)
        and (not task or task in e.task_id.lower() or task in e.env_id.lower())
        and (steps is None or (e.step is not None and steps[0] <= e.step <= steps[1]))
        and (q.reward_min is None or (e.reward is not None and e.reward >= q.reward_min))
        and (q.reward_max is None or (e.reward is not None and e.reward <= q.reward_max))
        and (not q.recorded or recorded(e))
    ]
    if q.sort == "line":  # file order already
        return out[::-1] if q.desc else out
    key = attrgetter(q.sort)
    present: list[Episode] = []
    missing: list[Episode] = []
    for e in out:
        (missing if key(e) is None else present).append(e)
    present.sort(key=key, reverse=q.desc)  # stable: ties stay in file order
    return present + missing


def solved_by_task(eps: Iterable[Episode]) -> dict[str, float]:
    """Each task's solved fraction over its episodes that were not infra errors (one episode: 0 or 1), each episode
    by its last row (``info["solved"]``, else a positive reward): the scorer's rule
    (``sao.eval.scores.solved_fractions``; an eval with ``eval.samples`` plays each task several times)."""
    from sao.eval.scores import solved_fractions

    return solved_fractions(
        (e.task_id, bool(e.solved if e.solved is not None else (e.reward or 0.0) > 0))
        for e in eps
        if e.ending != "infra_error" and e.row + 1 >= e.rows
    )
