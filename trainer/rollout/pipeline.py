"""The rollout coordinator: episodes in flight with the current weights, a bounded buffer, staleness-checked batches.

The episode is the unit of everything here: admission, back-pressure, batching, the staleness deadline and GRPO
groups. An episode's rows (one per token sequence the engine saw: a harness episode whose gateway session broke its
prefix has several, all with the episode's outcome) travel together as one buffer ``Item`` and train in one batch;
how many tokens a batch holds is the micro-batcher's business (``sao.trainer.learn.batch``). The ledger records rows
(each with its episode), the counters say rows and episodes apart.

SAO mode: ``rollout.concurrency`` episodes run at all times and never wait for the trainer, except that a full
buffer (``rollout.buffer_size`` finished, untaken episodes) pauses new starts. ``next_batch`` hands out the next
``batch_size`` episodes. The staleness bound (``max_staleness`` versions between the oldest action of an episode
and the step that trains it) holds in one of two ways (``trainer.staleness_policy``):

* ``wait`` (default): admission control, no finished work is dropped. Every untaken episode has a deadline (the
  last version that may train it: its start version + ``max_staleness``); an episode starts only if every untaken
  episode can still be trained by its deadline at ``batch_size`` per version (oldest first), and a batch waits for
  the oldest episodes whose deadline would otherwise pass. A long episode therefore holds the trainer back instead
  of being thrown away, which would bias training towards short episodes.
* ``drop``: take whatever finished first; drop (and record) any episode whose lag exceeds the bound.

Group mode (GRPO): each task runs ``group_size`` times (every member resets with the same seed and task, so the
members play the same prompt whatever the task source) and a group enters the buffer only when all of it finished;
a batch takes whole groups (``batch_size / group_size`` of them) and ``drop`` drops whole groups.
``synchronous=True`` (grpo) starts a batch's groups only after the previous batch was trained and synced
(``allow_next_batch(n)`` starts the ``n`` episodes that ``next_batch(n)`` then takes; a group that delivers nothing
trainable is started again). Infra-error rows are recorded and never enter the buffer. Episodes are played by the
agent's one episode runner (``sao.agent.episodes.EpisodeRunner.run_one``), which the coordinator keeps open (warm
sandbox pools) while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sao.agent.episodes import Episode, infra_error_trajectory, task_id_of
from sao.agent.records import Trajectory
from sao.trainer.rollout.ledger import Accounting, Ledger
from sao.trainer.rollout.versions import Lineage
from sao.trainer.runs.stopping import InfraStreak, RolloutsLost


class EpisodeSource(Protocol):
    """What plays one episode (``sao.agent.episodes.EpisodeRunner``): its rows, or its one trajectory; an async
    context manager if it holds resources."""

    async def run_one(self, episode: Episode) -> list[Trajectory] | Trajectory: ...


STALENESS_POLICIES = ("wait", "drop")


@dataclass
class Item:
    """A finished episode in the buffer: its rows in order (trained together, in one batch) and their ledger uids.
    ``start`` is a lower bound of the version its first action used; ``group`` its GRPO group (the task index its
    members share), None for a single rollout."""

    uids: list[str]
    rows: list[Trajectory]
    start: int = 0
    group: int | None = None

    @property
    def oldest_policy_version(self) -> int | None:
        """The oldest weights that sampled any of its rows (the episode's lag is measured from them)."""
        versions = [v for r in self.rows if (v := r.oldest_policy_version) is not None]
        return min(versions) if versions else None


@dataclass
class Counters:
    """Rows (``generated``, ``infra_error``, ``dropped_stale``, ``trained``: the ledger's unit) and episodes
    (``episodes_*``: the unit of admission, batching, staleness and grouping) apart. ``lags``: the lag of each
    episode of the last trained batch."""

    generated: int = 0
    infra_error: int = 0
    dropped_stale: int = 0
    trained: int = 0
    episodes_started: int = 0
    episodes_generated: int = 0  #: finished, infra errors included
    episodes_infra_error: int = 0  #: episodes with no trainable row
    episodes_dropped_stale: int = 0
    episodes_trained: int = 0
    lags: list[int] = field(default_factory=list)

    @classmethod
    def from_accounting(cls, acc: Accounting) -> Counters:
        """The counts a resumed run goes on from (its ledger's replay)."""
        return cls(
            generated=acc.generated, infra_error=acc.infra_error, dropped_stale=acc.dropped_stale,
            trained=acc.trained, episodes_generated=acc.episodes_generated,
            episodes_infra_error=acc.episodes_infra_error, episodes_dropped_stale=acc.episodes_dropped_stale,
            episodes_trained=acc.episodes_trained,
        )  # fmt: skip


def _groups(items: Sequence[Item]) -> list[list[int]]:
    """The GRPO groups of ``items`` (each episode a group of its own when it has none) as indices, in the order
    their first member arrived."""
    out: dict[tuple[str, int], list[int]] = {}
    for k, item in enumerate(items):
        out.setdefault(("item", k) if item.group is None else ("group", item.group), []).append(k)
    return list(out.values())


class TaskSource:
    """Task ``i`` -> (seed, reset options, task id by ``task_id_of``): a list of task records, or the env's own
    seeded sampler, whose task id is None: the env names the task it drew (``ResetInfo["task_id"]``) and that id
    reaches every record (an episode that fails before the env said is named ``task-<index>``)."""

    def __init__(self, tasks: list[dict[str, Any]] | None, seed: int) -> None:
        self.tasks, self.seed = tasks, seed

    def get(self, index: int) -> tuple[int, dict[str, Any] | None, str | None]:
        seed = self.seed * 1_000_003 + index
        if not self.tasks:
            return seed, None, None
        task = self.tasks[index % len(self.tasks)]
        return seed, {"task": task}, task_id_of(task, index)


class Coordinator:
    """Runs episodes on rank 0's event loop and feeds the learner (see module doc)."""

    def __init__(
        self,
        runner: EpisodeSource,
        tasks: TaskSource,
        ledger: Ledger,
        *,
        concurrency: int,
        buffer_size: int,
        max_staleness: int,
        group_size: int = 1,
        synchronous: bool = False,
        cursor: int = 0,
        seq: int = 0,
        staleness_policy: str = "wait",
        sync_every: int = 1,
        batch_size: int = 0,
        infra_stall_s: float = 0.0,
        lineage: Lineage | None = None,
    ) -> None:
        """``lineage``: the run's versions across its resumes (a resumed run's, from its ledger), for true lags."""
        if staleness_policy not in STALENESS_POLICIES:
            raise ValueError(f"staleness_policy must be one of {STALENESS_POLICIES}, got {staleness_policy!r}")
        self.runner = runner
        self.tasks, self.ledger = tasks, ledger
        self.concurrency, self.buffer_size, self.max_staleness = concurrency, buffer_size, max_staleness
        self.group_size, self.synchronous = group_size, synchronous
        self.cursor, self.seq = cursor, seq
        self.version = 0
        self.lineage = lineage or Lineage()
        self.buffer: deque[Item] = deque()
        self.counters = Counters()
        self._in_flight = 0
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._main: asyncio.Task[None] | None = None
        self._sync_budget = 0  # synchronous mode: episodes the trainer allowed for the next batch
        self._last_infra = ""
        self._batch_size = batch_size  # admission control needs it (0: learned from the first next_batch)
        self.staleness_policy, self.sync_every = staleness_policy, sync_every
        self._flying: dict[int, int] = {}  # start version -> episodes in flight that started then
        self._batch_taken_at = -1  # the version whose batch was handed out last
        self._infra_streak = InfraStreak(infra_stall_s, max(16, 2 * concurrency))  # rollout.infra_stall_s

    # -- producer ------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._main = asyncio.create_task(self._produce())

    def restore(self, records: list[dict[str, Any]], step: int = 0) -> None:
        """Put pending rows (from a resumed run's ledger) back into the buffer as their episodes (a ledger line's
        ``episode``; a line written before it existed is an episode of its own), in arrival order, each at its true
        lag along ``lineage`` (an episode of the branch the resume discarded included). A group with an episode
        already staler than ``max_staleness`` can never be trained within the bound, under either policy: it is
        dropped at ``step`` (counted and recorded)."""
        episodes: dict[str, Item] = {}
        for rec in records:
            traj = Trajectory.from_dict(rec["trajectory"])
            item = episodes.setdefault(str(rec.get("episode") or rec["uid"]), Item([], [], 0, traj.group_id))
            item.uids.append(rec["uid"])
            item.rows.append(traj)
        items = list(episodes.values())
        for group in _groups(items):
            members = [items[k] for k in group]
            if max(self.lag(i) for i in members) > self.max_staleness:
                self._drop(members, step, replace=False)
                continue
            for item in members:  # the start as a version of the current branch: later lags are differences from it
                item.start = self.version - self.lag(item)
                self.buffer.append(item)

    def _start_version(self) -> int:
        """A lower bound of the weights' version an episode starting now samples with: the trainer's version is
        set before its weights reach the engine, and the engine only syncs every ``sync_every`` versions."""
        return max(0, self.version - self.sync_every)

    def _first_open_version(self) -> int:
        """The version of the next batch not yet handed out."""
        return self.version + (1 if self._batch_taken_at == self.version else 0)

    def _untaken_starts(self, extra: int = 0) -> list[tuple[int, bool]]:
        """``(start version, finished)`` of every untaken episode (plus ``extra`` starting now), oldest first and
        finished first among equals."""
        out = [(i.start, True) for i in self.buffer]
        out += [(v, False) for v, k in self._flying.items() for _ in range(k)]
        out += [(self._start_version(), False)] * extra
        return sorted(out, key=lambda x: (x[0], not x[1]))

    def _overflow(self, starts: list[tuple[int, bool]], first: int, batch: int) -> int:
        """The most of the oldest episodes that batches from ``first`` on cannot train by their deadlines: the k-th
        oldest (deadline ``d``) needs ``k <= batch * (d - first + 1)``."""
        worst = 0
        for k, (start, _) in enumerate(starts, 1):
            worst = max(worst, k - batch * (start + self.max_staleness - first + 1))
        return worst

    def _room(self) -> bool:
        n = self.group_size
        if self._in_flight + n > max(self.concurrency, n):
            return False
        if self.synchronous:
            return self._sync_budget > 0
        # Backpressure: finished + running episodes never exceed the buffer, so a full buffer pauses new starts.
        if len(self.buffer) + self._in_flight + n > max(self.buffer_size, n):
            return False
        if self.staleness_policy == "wait" and self._batch_size:
            # Admission control: start only if every untaken episode can still be trained by its deadline.
            starts = self._untaken_starts(extra=n)
            return self._overflow(starts, self._first_open_version(), self._batch_size) <= 0
        return True

    async def _produce(self) -> None:
        async with contextlib.AsyncExitStack() as stack:
            if hasattr(self.runner, "__aenter__"):
                await stack.enter_async_context(self.runner)  # type: ignore[arg-type]
            await self._start_episodes()

    async def _start_episodes(self) -> None:
        while True:
            while not self._room():
                self._changed.clear()
                await self._changed.wait()
            index = self.cursor
            self.cursor += 1
            seed, options, task_id = self.tasks.get(index)
            n = self.group_size
            self._in_flight += n
            start = self._start_version()
            self._flying[start] = self._flying.get(start, 0) + n
            if self.synchronous:
                self._sync_budget -= n
            task = asyncio.create_task(self._group(index, seed, options, task_id, n, start))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _one(
        self, index: int, seed: int, options: dict[str, Any] | None, task_id: str | None
    ) -> list[Trajectory]:
        """The episode's rows (a harness episode whose gateway session broke its prefix has several; each is a
        trajectory of its own in the buffer and the ledger, all with the episode's outcome)."""
        self.counters.episodes_started += 1
        task = None if options is None else options.get("task")
        episode = Episode(index, task, seed, task_id)
        try:
            got = await self.runner.run_one(episode)
        except Exception as e:  # the runner records episode failures itself; this guards a runner that raised
            return [infra_error_trajectory(episode.tid, "unknown", e)]
        return got if isinstance(got, list) else [got]

    async def _group(
        self, index: int, seed: int, options: dict[str, Any] | None, task_id: str | None, n: int, start: int
    ) -> None:
        # Every member resets with the same seed and options: with the env's own sampler the seed picks the task,
        # so a different seed per member would give each member a different prompt (and no group baseline).
        try:
            played = await asyncio.gather(*(self._one(index, seed, options, task_id) for _ in range(n)))
        finally:
            self._in_flight -= n
            self._flying[start] -= n
            if not self._flying[start]:
                del self._flying[start]
        group = index if n > 1 else None
        delivered = [self._accept(index, [dataclasses.replace(t, group_id=group) for t in rows] if group is not None
                                  else rows, start, group) for rows in played]  # fmt: skip
        if self.synchronous and not any(delivered):
            self._sync_budget += n  # nothing of it can train: the batch it was started for needs another group
        self._changed.set()

    def _accept(self, index: int, rows: list[Trajectory], start: int, group: int | None) -> bool:
        """Record an episode's rows (each with its episode: the first row's uid) and buffer the trainable ones as
        one ``Item``; False when none is (infra-error rows are never trained)."""
        uids = [uuid.uuid4().hex for _ in rows]
        item = Item([], [], start, group)
        for uid, traj in zip(uids, rows, strict=True):
            self.ledger.arrived(uid, self.seq, index, traj, self.version, episode=uids[0])
            self.seq += 1
            self.counters.generated += 1
            if traj.status == "infra_error":
                self.counters.infra_error += 1
                self._last_infra = str(traj.info.get("infra_error", ""))
                continue
            item.uids.append(uid)
            item.rows.append(traj)
        self.counters.episodes_generated += 1
        if not item.rows:
            self.counters.episodes_infra_error += 1
            return False
        self.buffer.append(item)
        return True

    # -- consumer ------------------------------------------------------------------------------------------
    def allow_next_batch(self, n: int) -> None:
        """Synchronous mode: let the producer start ``n`` more episodes (the next batch: ``next_batch(n)``)."""
        self._sync_budget += n
        self._changed.set()

    def lag(self, x: Item | Trajectory) -> int:
        """Policy updates between the oldest weights that sampled ``x`` (an episode, or one row) and the current
        ones (``lineage``)."""
        oldest = x.oldest_policy_version
        return 0 if oldest is None else self.lineage.distance(oldest, self.version)

    async def next_batch(self, n: int, step: int) -> list[Item]:
        """The next ``n`` episodes, all their rows (waits until they exist); in group mode ``n / group_size`` whole
        groups. ``drop``: stale ones are dropped and logged; ``wait``: the oldest episodes whose deadline would pass
        are waited for and always taken."""
        self._batch_size = n
        self._changed.set()  # the producer's admission check needs the batch size
        if self.staleness_policy == "wait" and not self.synchronous:
            out = await self._batch_by_deadline(n)
        else:
            out = await self._batch_first_finished(n, step)
        self._batch_taken_at = self.version
        self._changed.set()  # room in the buffer: the producer may start another episode
        return out

    async def _wait_changed(self) -> None:
        if self._main is not None and self._main.done():
            self._main.result()  # surface a crashed producer instead of waiting forever
        self._check_infra()
        self._changed.clear()
        await self._changed.wait()

    def _take(self, picked: list[int]) -> list[Item]:
        """Remove the buffer's items at ``picked`` and return them in arrival order."""
        keep = set(picked)
        items = list(self.buffer)
        self.buffer = deque(item for k, item in enumerate(items) if k not in keep)
        return [items[k] for k in sorted(keep)]

    def _drop(self, items: list[Item], step: int, replace: bool = True) -> None:
        """Drop stale episodes (all their rows: counted and recorded); synchronous mode starts as many again
        (``replace``; a resume's restore does not: the run allows its first batch after it)."""
        uids = [u for i in items for u in i.uids]
        self.counters.dropped_stale += len(uids)
        self.counters.episodes_dropped_stale += len(items)
        self.ledger.event(uids, "dropped_stale", step, self.version)
        if self.synchronous and replace:
            self._sync_budget += len(items)

    async def _batch_first_finished(self, n: int, step: int) -> list[Item]:
        """Whole groups (episodes without groups) in arrival order until ``n`` episodes' worth of groups."""
        want = -(-n // self.group_size)
        out: list[Item] = []
        while want > 0:
            while not self.buffer:
                await self._wait_changed()
            self._check_infra()
            group = self._take(_groups(self.buffer)[0])
            self._changed.set()
            if self.staleness_policy == "drop" and max(self.lag(i) for i in group) > self.max_staleness:
                self._drop(group, step)
                continue
            out += group
            want -= 1
        return out

    async def _batch_by_deadline(self, n: int) -> list[Item]:
        """``n`` episodes (``n / group_size`` whole groups): first the oldest groups holding the episodes that a
        later batch could not train by their deadline (waiting for them to finish), then the rest in arrival
        order."""
        want = -(-n // self.group_size)
        while True:
            starts = self._untaken_starts()
            # this batch trains at self.version; what it leaves must fit into the batches from version + 1 on
            must = min(n, max(0, self._overflow(starts, self.version + 1, n)))
            groups = _groups(self.buffer)
            if len(groups) >= want and all(done for _, done in starts[:must]):
                break
            await self._wait_changed()
        self._check_infra()
        items = list(self.buffer)
        chosen: list[list[int]] = []
        for g in sorted(groups, key=lambda g: min(items[k].start for k in g)):  # stable: arrival order among equals
            if sum(len(c) for c in chosen) >= must:
                break
            chosen.append(g)
        for g in groups:
            if len(chosen) >= want:
                break
            if g not in chosen:
                chosen.append(g)
        return self._take([k for g in chosen for k in g])

    def _check_infra(self) -> None:
        """Nothing but infra errors: from the start (a setup error: RuntimeError, a resume would fail the same way),
        or for ``infra_stall_s`` after the run worked (the rollout side is gone: ``RolloutsLost``, a stop with a
        checkpoint and exit 75)."""
        c = self.counters
        if c.episodes_infra_error >= self._infra_streak.min_errors and c.episodes_generated == c.episodes_infra_error:
            raise RuntimeError(
                f"every one of the {c.episodes_generated} episodes so far ended in an infra error; the last: "
                f"{self._last_infra!r}. Fix the env/sandbox/engine setup (see trajectories.jsonl)"
            )
        lost = self._infra_streak.observe(c.episodes_generated, c.episodes_infra_error)
        if lost is not None:
            raise RolloutsLost(f"{lost}; the last: {self._last_infra!r}")

    def trained(self, items: list[Item], step: int) -> None:
        """Record that step ``step`` trained the episodes ``items`` (every row of each)."""
        uids = [u for i in items for u in i.uids]
        self.counters.trained += len(uids)
        self.counters.episodes_trained += len(items)
        self.counters.lags = [self.lag(i) for i in items]
        self.ledger.event(uids, "trained", step, self.version)

    async def stop(self) -> None:
        """Cancel the episodes in flight (their envs close), then the producer (which closes the runner)."""
        for group in (list(self._tasks), [self._main]):
            for t in group:
                if t is not None:
                    t.cancel()
            for t in group:
                if t is not None:
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await t
