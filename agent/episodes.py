"""The one episode runner: env factory + player -> trajectories, for training, evaluation and ``sao collect``.

Usage::

    runner = EpisodeRunner(env_factory, TokenPlayer(engine, tokenizer, AgentConfig()), RunnerConfig(concurrency=16),
                           out_path="trajectories.jsonl")
    stats = await runner.run(episodes_of(tasks), on_trajectory=buffer.put)   # any (async) iterable, may be endless
    runner.pause(); runner.resume(); runner.stop()                           # backpressure / shutdown

    async with runner:                                   # a caller with its own scheduler (the trainer)
        rows = await runner.run_one(Episode(index=7, task=task, seed=7))

``run_one`` is the single place an episode is played: a fresh env from ``env_factory()``, reset with
``options={"task": task}`` (or, with no task, the env's own seeded sampler), played by the ``Player`` (a token
engine: ``TokenPlayer``; a chat endpoint or a script: ``ChatPlayer``; an outside agent: ``sao.agent.harness``), then
closed (``sao.agent.protocols.close_env``). It returns the episode's rows: one trajectory for SAO's own loop; an
outside agent's episode has one per prefix break of its gateway session (``info["row"]`` / ``info["rows"]``; every row
carries the episode's outcome, ``is_last_row`` marks the one a per-episode consumer reads). Each row's ``info`` gets
``episode`` (the index) and ``seed``.
It never raises for one episode: an exception becomes ``infra_error_trajectory(...)``, the one constructor of
such records. ``run`` bounds the episodes in flight with an ``asyncio_pool.AioPool`` of ``concurrency`` slots,
writes each finished trajectory (row) to ``out_path`` (fsynced) and then hands it to the callback, in finishing
order. While the runner is open (``async with runner`` or inside ``run``) Docker sandboxes of its envs come from warm
pools sized by ``concurrency`` (``sao.sandboxes.pool.warm_pools``); leaving removes every container they hold. A
player that holds resources (a harness's gateway) is an async context manager, kept open while the runner is.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import time
import traceback
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Sized
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sao.agent.chat_loop import ChatModel, run_chat_episode
from sao.agent.engines.protocols import Engine
from sao.agent.loop import AgentConfig, run_episode
from sao.agent.protocols import AsyncEnv, close_env, env_id_of
from sao.agent.records import Trajectory, write_jsonl

OnTrajectory = Callable[[Trajectory], Awaitable[None] | None] | asyncio.Queue[Trajectory]


@dataclass(frozen=True)
class Episode:
    """One episode to play: ``task`` (a task record, or ``None`` for the env's own seeded draw), the reset
    ``seed``, and ``index`` (its position in the stream; also names the task when the record has no id).
    ``task_id``: given, or else ``tid`` names it by ``task_id_of``; for a task the env draws itself the env's own
    id (``ResetInfo["task_id"]``) names the records, and ``tid`` only one that failed before the env said."""

    index: int
    task: Any = None
    seed: int | None = None
    task_id: str | None = None

    @property
    def options(self) -> dict[str, Any] | None:
        return None if self.task is None else {"task": self.task}

    @property
    def tid(self) -> str:
        """The task id this episode's records carry: ``task_id``, else ``task_id_of(task, index)``."""
        return self.task_id or task_id_of(self.task, self.index)


def task_id_of(task: Any, index: int) -> str:
    """A task record's id (``task_id``, ``instance_id`` or ``id``), else ``task-<index>``: the one rule that names
    a task, for every episode source (``episodes_of``, the trainer's task source, the runners)."""
    if isinstance(task, dict):
        for key in ("task_id", "instance_id", "id"):
            if task.get(key) not in (None, ""):
                return str(task[key])
    return str(getattr(task, "task_id", None) or f"task-{index}")


def env_factory(env_id: str, kwargs: dict[str, Any] | None = None) -> Callable[[], Any]:
    """A zero-argument maker of fresh ``env_id`` envs (registered ``sao/`` ids, plugin envs, ``module:id``)."""
    import gymnasium

    from sao.envs.registration import load_plugin_envs, resolve_env_id

    load_plugin_envs()
    name, kw = resolve_env_id(env_id), dict(kwargs or {})
    return lambda: gymnasium.make(name, **kw).unwrapped


def episodes_of(tasks: Iterable[Any], *, seed: int | None = 0, samples: int = 1) -> list[Episode]:
    """Episodes for task records: ``samples`` per task, episode i reset with ``seed + i`` (``None``: unseeded)."""
    out: list[Episode] = []
    for task in tasks:
        for _ in range(samples):
            i = len(out)
            out.append(Episode(i, task, None if seed is None else seed + i, task_id_of(task, i)))
    return out


def infra_error_trajectory(
    task_id: str, env_id: str, error: BaseException | str, *, wall_s: float = 0.0, with_traceback: bool = True
) -> Trajectory:
    """The record of an episode the infrastructure failed (never trained on, counted apart)."""
    message = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    info: dict[str, Any] = {"infra_error": message}
    if with_traceback and isinstance(error, BaseException):
        info["traceback"] = "".join(traceback.format_exception(error, limit=8))
    return Trajectory(task_id, env_id, (), 0.0, "infra_error", info, {"total_s": wall_s})


class Player(Protocol):
    """Plays one episode of a freshly made env (not closed by the player): its trajectory, or its rows (a harness
    episode whose gateway session broke its prefix; see the module doc)."""

    async def play(self, env: AsyncEnv, episode: Episode) -> Trajectory | list[Trajectory]: ...


def is_last_row(traj: Trajectory) -> bool:
    """Whether ``traj`` is its episode's last row (any trajectory of SAO's own loop is): where a consumer that
    wants one record per episode (an eval's verdict, a progress count) reads the episode's outcome."""
    return int(traj.info.get("row", 0)) + 1 >= int(traj.info.get("rows", 1))


@dataclass
class TokenPlayer:
    """A token-in/token-out engine (vLLM, HF, scripted, solver) through ``sao.agent.loop.run_episode``.

    ``render_check_every``: every N-th episode (by index) is checked for render drift (0: never)."""

    engine: Engine
    tokenizer: Any
    cfg: AgentConfig = field(default_factory=AgentConfig)
    render_check_every: int = 0

    on_turn: Callable[[], None] | None = None
    """Called after each sampled action (the runner's progress counts turns of episodes still in flight)."""

    async def play(self, env: AsyncEnv, episode: Episode) -> Trajectory:
        check = self.render_check_every > 0 and episode.index % self.render_check_every == 0
        engine = self.engine if self.on_turn is None else _TurnCounter(self.engine, self.on_turn)
        return await run_episode(
            env, engine, self.tokenizer, self.cfg, task_id=episode.task_id, seed=episode.seed,
            options=episode.options, check_render=check,
        )  # fmt: skip


class _TurnCounter:
    """The player's engine, calling ``on_turn`` after each generation (every other attribute passes through)."""

    def __init__(self, engine: Engine, on_turn: Callable[[], None]) -> None:
        self._engine, self._on_turn = engine, on_turn

    async def generate(self, prompt_ids: list[int], sampling: Any) -> Any:
        gen = await self._engine.generate(prompt_ids, sampling)
        self._on_turn()
        return gen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


@dataclass
class ChatPlayer:
    """A chat model (``OpenAIChatModel``) or, with ``per_task``, a model made per task id (a script)."""

    model: ChatModel | None = None
    per_task: Callable[[str], ChatModel] | None = None
    max_turns: int = 32

    async def play(self, env: AsyncEnv, episode: Episode) -> Trajectory:
        model = self.per_task(episode.tid) if self.per_task is not None else self.model
        if model is None:
            raise ValueError("ChatPlayer needs a model or a per_task factory")
        return await run_chat_episode(
            env, model, max_turns=self.max_turns, task_id=episode.task_id, seed=episode.seed, options=episode.options
        )


@dataclass(frozen=True)
class RunnerConfig:
    """``concurrency``: episodes in flight (and idle warm containers per sandbox image). ``progress``: a bar."""

    concurrency: int = 8
    progress: bool = True

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")


@dataclass
class EpisodeStats:
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


async def _aiter(items: Iterable[Any] | AsyncIterable[Any]) -> AsyncIterator[Any]:
    if isinstance(items, AsyncIterable):
        async for x in items:
            yield x
    else:
        for x in items:
            yield x


class EpisodeRunner:
    """Plays episodes of ``env_factory()`` envs with one player (see the module docstring)."""

    def __init__(
        self,
        env_factory: Callable[[], Any],
        player: Player,
        cfg: RunnerConfig | None = None,
        *,
        out_path: str | Path | None = None,
    ) -> None:
        self.env_factory, self.player = env_factory, player
        self.cfg = cfg or RunnerConfig()
        self.out_path = Path(out_path) if out_path else None
        self.stats = EpisodeStats()
        self._running = asyncio.Event()
        self._running.set()
        self._stopped = False
        self._emit_lock = asyncio.Lock()  # one writer at a time: whole lines, same order on disk and in the callback
        self._pools: contextlib.AsyncExitStack | None = None
        self._opened = 0
        self.sandbox_pools: Any = None  # the sao.sandboxes.pool.PoolSet while open

    # ---- lifetime of the warm sandbox pools ---------------------------------------------------------------
    async def __aenter__(self) -> EpisodeRunner:
        if self._opened == 0:
            from sao.sandboxes.pool import warm_pools

            stack = contextlib.AsyncExitStack()
            self.sandbox_pools = await stack.enter_async_context(warm_pools(self.cfg.concurrency))
            if hasattr(self.player, "__aenter__"):
                await stack.enter_async_context(self.player)  # type: ignore[arg-type]
            self._pools = stack
        self._opened += 1
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._opened -= 1
        if self._opened == 0:
            stack, self._pools = self._pools, None
            if stack is not None:
                await stack.aclose()
            self.sandbox_pools = None

    # ---- control ------------------------------------------------------------------------------------------
    def pause(self) -> None:
        """Start no new episode until ``resume()`` (episodes in flight finish)."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def stop(self) -> None:
        """Take no more episodes; ``run`` returns once the episodes in flight are done."""
        self._stopped = True
        self._running.set()

    # ---- one episode --------------------------------------------------------------------------------------
    async def run_one(self, episode: Episode) -> list[Trajectory]:
        """Play one episode in a fresh env and close it: its rows (one, unless a harness's session broke its
        prefix); never raises (a failure is one infra_error record)."""
        t0 = time.perf_counter()
        env: Any = None
        task_id = episode.tid
        if episode.task_id is None and episode.task is not None:
            # a task record's id for the player; a task the env draws itself keeps the id the env gives it
            episode = dataclasses.replace(episode, task_id=task_id)
        try:
            env = self.env_factory()
            played = await self.player.play(env, episode)
            rows = played if isinstance(played, list) else [played]
        except Exception as e:  # any failure of one episode must not end the run
            env_id = env_id_of(env) if env is not None else "unknown"
            rows = [infra_error_trajectory(task_id, env_id, e, wall_s=time.perf_counter() - t0)]
        finally:
            await close_env(env)
        # Which episode this was (resuming `sao collect`, matching eval samples): a new record, never a mutation.
        where = {"episode": episode.index, "seed": episode.seed}
        return [dataclasses.replace(t, info={**t.info, **where}) for t in rows]

    # ---- many episodes ------------------------------------------------------------------------------------
    async def _emit(self, rows: list[Trajectory], on_trajectory: OnTrajectory | None) -> None:
        """One episode's rows, in order: to ``out_path``, to the stats (the episode counted once), to the callback."""
        async with self._emit_lock:
            if self.out_path is not None:
                await asyncio.to_thread(write_jsonl, self.out_path, rows)
            self.stats.add(rows[-1])
            for traj in rows:
                if isinstance(on_trajectory, asyncio.Queue):
                    await on_trajectory.put(traj)
                elif on_trajectory is not None:
                    res = on_trajectory(traj)
                    if inspect.isawaitable(res):
                        await res

    async def run(
        self,
        episodes: Iterable[Episode] | AsyncIterable[Episode],
        on_trajectory: OnTrajectory | None = None,
        total: int | None = None,
    ) -> EpisodeStats:
        """Play every episode (until exhausted or ``stop()``); return this runner's stats so far.

        A failing callback or file write stops the run and is raised once the episodes in flight are done."""
        if self.out_path is not None:
            self.out_path.parent.mkdir(parents=True, exist_ok=True)
        if total is None and isinstance(episodes, Sized):
            total = len(episodes)
        errors: list[BaseException] = []
        t_start = time.perf_counter()
        # The bar closes after the pool has waited for the episodes in flight (context managers exit in reverse).
        turns = _turn_limit(self.player)
        async with (
            self,
            _progress(self.cfg.progress, total, turns, self.cfg.concurrency) as bar,
            _counting_turns(self.player, bar),
            _episode_pool(self.cfg.concurrency) as pool,
        ):

            async def one(episode: Episode) -> None:
                await self._running.wait()  # a pause holds episodes that got a slot but have not started
                if self._stopped:
                    return
                rows = await self.run_one(episode)
                try:
                    await self._emit(rows, on_trajectory)
                    bar(rows[-1])
                except BaseException as e:
                    errors.append(e)
                    self.stop()

            started = 0
            async for episode in _aiter(episodes):
                await self._running.wait()
                if self._stopped:
                    break
                await pool.spawn(one(episode))  # waits for a free slot
                started += 1
                if total is not None and self.sandbox_pools is not None:
                    self.sandbox_pools.remaining = total - started  # keep no warm containers nobody will use
        self.stats.wall_s += time.perf_counter() - t_start
        if errors:
            raise errors[0]
        return self.stats


@contextlib.asynccontextmanager
async def _episode_pool(size: int) -> AsyncIterator[Any]:
    """An ``AioPool`` of ``size`` slots that, when the run is cancelled (Ctrl-C, SIGTERM through ``sao``'s entry)
    or fails, cancels its episodes instead of waiting for them: each one's ``finally`` closes its env, and the warm
    pools close after, so no container outlives the command."""
    from asyncio_pool import AioPool

    async with AioPool(size=size) as pool:
        try:
            yield pool
            await pool.join()
        except BaseException:
            await pool.cancel()
            raise


def _turn_limit(player: Any) -> int | None:
    cfg = getattr(player, "cfg", None)
    return int(cfg.max_turns) if isinstance(cfg, AgentConfig) else None


@contextlib.asynccontextmanager
async def _counting_turns(player: Any, bar: _Advance) -> AsyncIterator[None]:
    """While the runner runs, the turns of a player that reports them (an ``on_turn`` hook: a ``TokenPlayer``, a
    harness's player) advance the progress line's ETA."""
    if not hasattr(player, "on_turn") or player.on_turn is not None:
        yield
        return
    player.on_turn = bar.turn
    try:
        yield
    finally:
        player.on_turn = None


class _Advance(Protocol):
    def __call__(self, traj: Trajectory) -> None: ...

    def turn(self) -> None: ...


class _progress(contextlib.AbstractAsyncContextManager["_Advance"]):
    """A progress line (or nothing): ``advance(traj)`` counts an episode and shows the mean reward and the infra
    errors; ``advance.turn()`` counts a turn of an episode in flight. The ETA is timed by turns: the expected total
    is ``total`` x the mean turns of finished episodes (the turn limit before any finished), so a line over 32
    episodes that run at once moves and gives a sane ETA long before the first episode ends (once the first wave of
    turns, one per episode in flight, is done)."""

    def __init__(self, enabled: bool, total: int | None, max_turns: int | None = None, concurrency: int = 1) -> None:
        self.enabled, self.total, self.max_turns, self.concurrency = enabled, total, max_turns, concurrency
        self.n, self.reward, self.infra = 0, 0.0, 0
        self.turns, self.finished_turns = 0, 0

    async def __aenter__(self) -> _Advance:
        enabled = self.enabled
        if enabled:
            from sao.core.console import ProgressLine

            self.bar = ProgressLine("episodes", self.total)  # one 80-column line with an ETA
        me = self

        class Advance:
            def __call__(self, traj: Trajectory) -> None:
                me.n += 1
                me.reward += traj.reward
                me.infra += traj.status == "infra_error"
                me.finished_turns += int(traj.info.get("turns", 0) or 0)
                if enabled:
                    me._work()
                    infra = f", infra errors {me.infra}" if me.infra else ""
                    me.bar.advance(1, f"turns {me.turns}, mean reward {me.reward / me.n:.3f}{infra}")

            def turn(self) -> None:
                me.turns += 1
                if enabled:
                    me._work()
                    reward = f", mean reward {me.reward / me.n:.3f}" if me.n else ""
                    me.bar.update(me.bar.done, f"turns {me.turns}{reward}")  # a pipe gets a line every 10 s

        return Advance()

    def _work(self) -> None:
        # Episodes in flight share the engine, so their turns end in waves: a rate read before the first wave is
        # over (one turn per episode in flight) is noise, and no ETA is better than a wild one.
        if not self.total:
            return
        if self.turns < min(self.concurrency, self.total):
            self.bar.set_work(0.0, 1.0)  # no rate yet: the line shows '?', not an ETA read off one early episode
            return
        per_episode = self.finished_turns / self.n if self.n and self.finished_turns else self.max_turns
        if per_episode:
            # every episode not yet finished has at least one turn to go (the first to finish are the short ones)
            self.bar.set_work(self.turns, max(self.total * per_episode, self.turns + self.total - self.n))

    async def __aexit__(self, *exc: object) -> None:
        if self.enabled:
            self.bar.close()
