"""RUN_DIR/trajectories.jsonl: every row (a trajectory) appended as it arrives, then its fate (trained / dropped).

Lines (JSON, fsynced):
- ``{"type": "trajectory", "uid", "seq", "task_index", "status", "arrived_version", "episode", "trajectory": {...}}``:
  one row; ``episode`` names its episode (the uid of the episode's first row; the rows of an episode are trained or
  dropped together). A line written before ``episode`` existed is an episode of its own.
- ``{"type": "event", "uid", "event": "trained" | "dropped_stale", "step", "version"}``
- ``{"type": "resume", "from_step", "from_version", "next_version"}``: a run resumed from the checkpoint of
  ``from_step`` (policy version ``from_version``); events of later steps written before it belong to the lost branch
  and are void (their trajectories are pending again). The resumed run goes on under version ``next_version``, one
  above every version the file shows, an alias of ``from_version`` (``sao.trainer.rollout.versions``): versions are
  never reused, so a pending trajectory of the lost branch keeps its true lag. A resume record written before these
  two fields existed aliases nothing (that run reused its versions).

``accounting`` replays the file: each trajectory has exactly one final state (trained, dropped_stale,
infra_error or pending), so ``generated = trained + dropped_stale + infra_error + pending`` holds by construction
and a trajectory trained twice is reported. The ``episodes_*`` counts say the same per episode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sao.agent.records import Trajectory
from sao.core.jsonl import JsonlAppender, iter_jsonl


class Ledger:
    """Append-only writer of trajectories.jsonl."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._out = JsonlAppender(self.path)

    def _write(self, rec: dict[str, Any]) -> None:
        self._out.append(rec)

    def arrived(
        self, uid: str, seq: int, task_index: int, traj: Trajectory, version: int, episode: str | None = None
    ) -> None:
        """One row of episode ``episode`` (None: an episode of its own)."""
        self._write(
            {
                "type": "trajectory",
                "uid": uid,
                "seq": seq,
                "task_index": task_index,
                "status": traj.status,
                "arrived_version": version,
                "episode": episode or uid,
                "trajectory": traj.to_dict(),
            }
        )

    def event(self, uids: list[str], event: str, step: int, version: int) -> None:
        self._out.append(*({"type": "event", "uid": u, "event": event, "step": step, "version": version} for u in uids))

    def resume(self, from_step: int, from_version: int | None = None, next_version: int | None = None) -> None:
        rec: dict[str, Any] = {"type": "resume", "from_step": from_step}
        if from_version is not None and next_version is not None:
            rec.update(from_version=from_version, next_version=next_version)
        self._write(rec)

    def close(self) -> None:
        self._out.close()


@dataclass
class Accounting:
    """Rows by final state (``generated`` ... ``pending``) and episodes by theirs (``episodes_*``: an episode is
    trained or dropped when its rows are, an infra error when none of its rows is trainable)."""

    generated: int = 0
    trained: int = 0
    dropped_stale: int = 0
    infra_error: int = 0
    pending: int = 0
    double_trained: list[str] = field(default_factory=list)
    pending_uids: list[str] = field(default_factory=list)
    episodes_generated: int = 0
    episodes_trained: int = 0
    episodes_dropped_stale: int = 0
    episodes_infra_error: int = 0
    max_seq: int = -1
    max_task_index: int = -1
    max_version: int = 0  #: the highest policy version the run ever used, lost branches included
    aliases: dict[int, int] = field(default_factory=dict)  #: resumes' ``next_version`` -> ``from_version``

    def balanced(self) -> bool:
        return self.generated == self.trained + self.dropped_stale + self.infra_error + self.pending


def _versions(rec: dict[str, Any]) -> list[int]:
    """The policy versions a ledger line shows as used: a trajectory's sampling versions and arrival version, an
    event's version (and, after a trained step, the next one: the step made it), a resume's new version."""
    kind = rec.get("type")
    if kind == "trajectory":
        sampled = [g.get("policy_version") for g in rec["trajectory"].get("segments") or []]
        return [int(rec.get("arrived_version", 0))] + [int(v) for v in sampled if v is not None]
    if kind == "event":
        return [int(rec["version"]) + (rec["event"] == "trained")]
    if kind == "resume" and "next_version" in rec:
        return [int(rec["next_version"])]
    return []


def replay(path: str | Path, resume_from: int | None = None) -> tuple[Accounting, dict[str, dict[str, Any]]]:
    """Replay trajectories.jsonl; returns the accounting and the pending trajectory records by uid (in order).
    ``resume_from``: replay as if a resume from that step's checkpoint followed the last line (what a resuming run
    needs before it writes its resume record, which names ``max_version + 1``). A torn last line (a kill mid-write) is
    ignored; the ledger's next append sets it aside (``sao.core.jsonl``)."""
    acc = Accounting()
    records: dict[str, dict[str, Any]] = {}
    events: list[tuple[str, str, int]] = []  # (uid, event, step)
    p = Path(path)
    if not p.exists():
        return acc, {}
    fix = "the run's ledger is damaged before its last line; restore it or start a new run.dir"
    for _, rec in iter_jsonl(p, torn_tail_ok=True, fix=fix):
        kind = rec.get("type")
        acc.max_version = max(acc.max_version, *_versions(rec), 0)
        if kind == "trajectory":
            records[rec["uid"]] = rec
            acc.max_seq = max(acc.max_seq, int(rec["seq"]))
            acc.max_task_index = max(acc.max_task_index, int(rec["task_index"]))
        elif kind == "event":
            events.append((rec["uid"], rec["event"], int(rec["step"])))
        elif kind == "resume":
            cut = int(rec["from_step"])
            events = [e for e in events if e[2] <= cut]
            if "next_version" in rec:
                acc.aliases[int(rec["next_version"])] = int(rec["from_version"])
    if resume_from is not None:
        events = [e for e in events if e[2] <= resume_from]
    trained_count: dict[str, int] = {}
    final: dict[str, str] = {}
    for uid, ev, _ in events:
        final[uid] = ev
        if ev == "trained":
            trained_count[uid] = trained_count.get(uid, 0) + 1
    acc.double_trained = sorted(u for u, c in trained_count.items() if c > 1)
    pending: dict[str, dict[str, Any]] = {}
    episodes: dict[str, str] = {}  # episode -> its state: that of its first trainable row, else infra_error
    for uid, rec in records.items():
        state = "infra_error" if rec["status"] == "infra_error" else final.get(uid, "pending")
        setattr(acc, state, getattr(acc, state) + 1)
        if state == "pending":
            pending[uid] = rec
        key = str(rec.get("episode") or uid)
        if episodes.get(key, "infra_error") == "infra_error":
            episodes[key] = state
    acc.generated = len(records)
    acc.episodes_generated = len(episodes)
    for state in episodes.values():
        if state != "pending":
            name = f"episodes_{state}"
            setattr(acc, name, getattr(acc, name) + 1)
    acc.pending_uids = list(pending)
    return acc, pending
