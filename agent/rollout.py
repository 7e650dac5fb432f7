"""RolloutWorker: many episodes at once, each finished trajectory streamed to a callback and appended to JSONL.

Usage (the trainer's view)::

    worker = RolloutWorker(env_factory, engine, tokenizer, RolloutConfig(concurrency=16), out_path="traj.jsonl")
    stats = await worker.run(tasks, on_trajectory=buffer.put)   # tasks: any (async) iterable, may be endless
    worker.pause(); worker.resume(); worker.stop()               # backpressure / shutdown from the trainer

Each task is given to a fresh env from ``env_factory()`` as ``areset(seed=..., options={"task": task})``; the
env is closed afterwards. At most ``concurrency`` episodes run at once; ``pause()`` stops new episodes from
starting (running ones finish). An episode that raises becomes an ``infra_error`` trajectory with the error in
``info`` (the run goes on). Trajectories are written to ``out_path`` (fsynced) before the callback sees them.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import traceback
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Sized
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.engines.protocols import Engine
from agent.loop import AgentConfig, AsyncEnv, env_id_of, run_episode
from agent.records import Trajectory, write_jsonl

OnTrajectory = Callable[[Trajectory], Awaitable[None] | None] | asyncio.Queue[Trajectory]


@dataclass(frozen=True)
class RolloutConfig:
    """``concurrency``: episodes in flight. ``seed``: episode i is reset with ``seed + i`` (None: unseeded).
    ``progress``: show a progress bar."""

    concurrency: int = 8
    seed: int | None = 0
    progress: bool = True
    agent: AgentConfig = field(default_factory=AgentConfig)

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"RolloutConfig.concurrency must be >= 1, got {self.concurrency}")


@dataclass
class RolloutStats:
    episodes: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    reward_sum: float = 0.0
    wall_s: float = 0.0
    engine_s: float = 0.0
    env_s: float = 0.0
    episode_s: float = 0.0

    def add(self, t: Trajectory) -> None:
        self.episodes += 1
        self.by_status[t.status] = self.by_status.get(t.status, 0) + 1
        self.reward_sum += t.reward
        self.engine_s += t.timings.get("engine_s", 0.0)
        self.env_s += t.timings.get("env_s", 0.0)
        self.episode_s += t.timings.get("total_s", 0.0)

    @property
    def agent_overhead(self) -> float:
        """Fraction of episode time spent outside the engine and the env (the agent's own cost)."""
        return (self.episode_s - self.engine_s - self.env_s) / self.episode_s if self.episode_s else 0.0


def task_id_of(task: Any, index: int) -> str:
    if isinstance(task, dict):
        for key in ("task_id", "instance_id", "id"):
            if task.get(key) is not None:
                return str(task[key])
    return str(getattr(task, "task_id", None) or f"task-{index}")


async def _aiter(tasks: Iterable[Any] | AsyncIterable[Any]) -> Any:
    if isinstance(tasks, AsyncIterable):
        async for t in tasks:
            yield t
    else:
        for t in tasks:
            yield t


class RolloutWorker:
    """Runs episodes of ``env_factory()`` envs against one engine (see module doc)."""

    def __init__(
        self,
        env_factory: Callable[[], AsyncEnv],
        engine: Engine,
        tokenizer: Any,
        cfg: RolloutConfig | None = None,
        *,
        out_path: str | Path | None = None,
    ) -> None:
        self.env_factory, self.engine, self.tokenizer = env_factory, engine, tokenizer
        self.cfg = cfg or RolloutConfig()
        self.out_path = Path(out_path) if out_path else None
        self._running = asyncio.Event()
        self._running.set()
        self._stopped = False
        self.stats = RolloutStats()
        self._emit_lock = asyncio.Lock()  # one writer at a time: whole lines, same order on disk and in the callback

    def pause(self) -> None:
        """Start no new episode until ``resume()`` (episodes in flight finish)."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def stop(self) -> None:
        """Take no more tasks; ``run`` returns once the episodes in flight are done."""
        self._stopped = True
        self._running.set()

    async def run_one(self, task: Any, index: int) -> Trajectory:
        """One episode; never raises (an exception becomes an infra_error trajectory)."""
        t0 = time.perf_counter()
        env: Any = None
        task_id = task_id_of(task, index)
        try:
            env = self.env_factory()
            seed = None if self.cfg.seed is None else self.cfg.seed + index
            return await run_episode(
                env, self.engine, self.tokenizer, self.cfg.agent, task_id=task_id, seed=seed, options={"task": task}
            )
        except Exception as e:  # any failure of one episode must not end the run
            info = {"infra_error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=8)}
            wall = time.perf_counter() - t0
            return Trajectory(task_id, env_id_of(env), (), 0.0, "infra_error", info, {"total_s": wall})
        finally:
            if env is not None:
                await _close(env)

    async def _emit(self, traj: Trajectory, on_trajectory: OnTrajectory | None) -> None:
        async with self._emit_lock:
            if self.out_path is not None:
                await asyncio.to_thread(write_jsonl, self.out_path, [traj])
            self.stats.add(traj)
            if isinstance(on_trajectory, asyncio.Queue):
                await on_trajectory.put(traj)
            elif on_trajectory is not None:
                res = on_trajectory(traj)
                if inspect.isawaitable(res):
                    await res

    async def run(
        self,
        tasks: Iterable[Any] | AsyncIterable[Any],
        on_trajectory: OnTrajectory | None = None,
        total: int | None = None,
    ) -> RolloutStats:
        """Run every task (until exhausted or ``stop()``); return the stats of this worker so far."""
        if self.out_path is not None:
            self.out_path.parent.mkdir(parents=True, exist_ok=True)
        if total is None and isinstance(tasks, Sized):
            total = len(tasks)
        slots = asyncio.Semaphore(self.cfg.concurrency)
        in_flight: set[asyncio.Task[None]] = set()
        errors: list[BaseException] = []
        t_start = time.perf_counter()
        with _progress(self.cfg.progress, total) as advance:

            async def one(task: Any, index: int) -> None:
                try:
                    traj = await self.run_one(task, index)
                    await self._emit(traj, on_trajectory)
                    advance(traj)
                except BaseException as e:  # a failing callback or file write: stop the run, re-raise below
                    errors.append(e)
                    self.stop()
                finally:
                    slots.release()

            index = 0
            async for task in _aiter(tasks):
                await slots.acquire()
                await self._running.wait()  # after the slot: a pause during the wait still holds new starts
                if self._stopped:
                    slots.release()
                    break
                t = asyncio.create_task(one(task, index))
                in_flight.add(t)
                t.add_done_callback(in_flight.discard)
                index += 1
            if in_flight:
                await asyncio.gather(*in_flight)
        self.stats.wall_s += time.perf_counter() - t_start
        if errors:
            raise errors[0]
        return self.stats


async def _close(env: Any) -> None:
    try:
        if hasattr(env, "aclose"):
            await env.aclose()
        elif hasattr(env, "close"):
            env.close()
    except Exception:  # a failing close must not turn a finished episode into an error
        pass


class _progress:
    """A rich progress bar (or nothing) whose ``advance(traj)`` shows the mean reward so far."""

    def __init__(self, enabled: bool, total: int | None) -> None:
        self.enabled, self.total = enabled, total
        self.n, self.reward = 0, 0.0

    def __enter__(self) -> Callable[[Trajectory], None]:
        if not self.enabled:
            return lambda t: None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(
            TextColumn("rollouts"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
            TimeElapsedColumn(), transient=False,
        )  # fmt: skip
        self.bar.start()
        self.task = self.bar.add_task("", total=self.total)

        def advance(t: Trajectory) -> None:
            self.n += 1
            self.reward += t.reward
            self.bar.update(self.task, advance=1, description=f"mean reward {self.reward / self.n:.3f}")

        return advance

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.bar.stop()
