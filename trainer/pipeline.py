"""The rollout coordinator: episodes in flight with the current weights, a bounded buffer, staleness-checked batches.

SAO mode: ``rollout.concurrency`` episodes run at all times and never wait for the trainer, except that a full
buffer (``rollout.buffer_size`` finished, untaken trajectories) pauses new starts: that backpressure bounds how
stale a trajectory can get. ``next_batch`` hands out the next ``batch_size`` trajectories the moment they exist,
dropping (and recording) any whose oldest action segment is more than ``max_staleness`` versions behind.
Group mode (GRPO): each task runs ``group_size`` times and a group enters the buffer only when all of it finished;
``synchronous=True`` (grpo) starts a batch's groups only after the previous batch was trained and synced.
Infra-error trajectories are recorded and never enter the buffer. Episodes are played by the agent's one episode
runner (``agent.rollout.EpisodeRunner.run_one``), which the coordinator keeps open (warm sandbox pools) while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.records import Trajectory
from agent.rollout import Episode, infra_error_trajectory
from trainer.ledger import Ledger


class EpisodeSource(Protocol):
    """What plays one episode (``agent.rollout.EpisodeRunner``); an async context manager if it holds resources."""

    async def run_one(self, episode: Episode) -> Trajectory: ...


@dataclass
class Item:
    uid: str
    traj: Trajectory


@dataclass
class Counters:
    generated: int = 0
    infra_error: int = 0
    dropped_stale: int = 0
    trained: int = 0
    episodes_started: int = 0
    lags: list[int] = field(default_factory=list)


class TaskSource:
    """Task ``i`` -> (seed, reset options): a list of task records, or the env's own seeded sampler."""

    def __init__(self, tasks: list[dict[str, Any]] | None, seed: int) -> None:
        self.tasks, self.seed = tasks, seed

    def get(self, index: int) -> tuple[int, dict[str, Any] | None, str | None]:
        seed = self.seed * 1_000_003 + index
        if not self.tasks:
            return seed, None, None
        task = self.tasks[index % len(self.tasks)]
        return seed, {"task": task}, str(task.get("id", task.get("instance_id", index)))


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
    ) -> None:
        self.runner = runner
        self.tasks, self.ledger = tasks, ledger
        self.concurrency, self.buffer_size, self.max_staleness = concurrency, buffer_size, max_staleness
        self.group_size, self.synchronous = group_size, synchronous
        self.cursor, self.seq = cursor, seq
        self.version = 0
        self.buffer: deque[Item] = deque()
        self.counters = Counters()
        self._in_flight = 0
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._main: asyncio.Task[None] | None = None
        self._sync_budget = 0  # synchronous mode: episodes the trainer allowed for the next batch
        self._last_infra = ""

    # -- producer ------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._main = asyncio.create_task(self._produce())

    def restore(self, records: list[dict[str, Any]]) -> None:
        """Put pending trajectories (from a resumed run's ledger) back into the buffer, in arrival order."""
        for rec in records:
            self.buffer.append(Item(rec["uid"], Trajectory.from_dict(rec["trajectory"])))

    def _room(self) -> bool:
        n = self.group_size
        if self._in_flight + n > max(self.concurrency, n):
            return False
        if self.synchronous:
            return self._sync_budget > 0
        # Backpressure: finished + running episodes never exceed the buffer, so a full buffer pauses new starts.
        return len(self.buffer) + self._in_flight + n <= max(self.buffer_size, n)

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
            if self.synchronous:
                self._sync_budget -= n
            task = asyncio.create_task(self._group(index, seed, options, task_id, n))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _one(self, index: int, seed: int, options: dict[str, Any] | None, task_id: str | None) -> Trajectory:
        self.counters.episodes_started += 1
        task = None if options is None else options.get("task")
        try:
            return await self.runner.run_one(Episode(index, task, seed, task_id))
        except Exception as e:  # the runner records episode failures itself; this guards a runner that raised
            return infra_error_trajectory(task_id or str(index), "unknown", e)

    async def _group(self, index: int, seed: int, options: dict[str, Any] | None, task_id: str | None, n: int) -> None:
        try:
            trajs = await asyncio.gather(*(self._one(index, seed + k, options, task_id) for k in range(n)))
        finally:
            self._in_flight -= n
        for traj in trajs:
            self._accept(index, dataclasses.replace(traj, group_id=index) if n > 1 else traj)
        self._changed.set()

    def _accept(self, index: int, traj: Trajectory) -> None:
        uid = uuid.uuid4().hex
        self.ledger.arrived(uid, self.seq, index, traj, self.version)
        self.seq += 1
        self.counters.generated += 1
        if traj.status == "infra_error":
            self.counters.infra_error += 1
            self._last_infra = str(traj.info.get("infra_error", ""))
            return
        self.buffer.append(Item(uid, traj))

    # -- consumer ------------------------------------------------------------------------------------------
    def allow_next_batch(self, n: int) -> None:
        """Synchronous mode: let the producer start ``n`` more episodes (the next batch)."""
        self._sync_budget += n
        self._changed.set()

    def lag(self, traj: Trajectory) -> int:
        oldest = traj.oldest_policy_version
        return 0 if oldest is None else max(0, self.version - oldest)

    async def next_batch(self, n: int, step: int) -> list[Item]:
        """The next ``n`` fresh-enough trajectories (waits until they exist); stale ones are dropped and logged."""
        out: list[Item] = []
        while len(out) < n:
            if self._main is not None and self._main.done():
                self._main.result()  # surface a crashed producer instead of waiting forever
            while not self.buffer:
                self._check_infra()
                self._changed.clear()
                await self._changed.wait()
            self._check_infra()
            item = self.buffer.popleft()
            self._changed.set()  # room in the buffer: the producer may start another episode
            if self.lag(item.traj) > self.max_staleness:
                self.counters.dropped_stale += 1
                self.ledger.event([item.uid], "dropped_stale", step, self.version)
                continue
            out.append(item)
        return out

    def _check_infra(self) -> None:
        c = self.counters
        if c.infra_error >= max(16, 2 * self.concurrency) and c.generated == c.infra_error:
            raise RuntimeError(
                f"every one of the {c.generated} episodes so far ended in an infra error; the last: "
                f"{self._last_infra!r}. Fix the env/sandbox/engine setup (see trajectories.jsonl)"
            )

    def trained(self, items: list[Item], step: int) -> None:
        self.counters.trained += len(items)
        self.counters.lags = [self.lag(i.traj) for i in items]
        self.ledger.event([i.uid for i in items], "trained", step, self.version)

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
