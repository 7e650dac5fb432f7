"""WarmPool: containers of one image started ahead in the background, so ``acquire()`` takes milliseconds.

Usage::

    pool = await WarmPool(SandboxConfig(image=tag), PoolConfig(size=4, max_concurrency=32)).start()
    async with pool.lease() as sb:          # or: sb = await pool.acquire(); ...; await sb.close()
        await sb.exec("pytest -q")
    await pool.aclose()                     # drains: waits for leased sandboxes, removes idle ones

A leased container is destroyed when it is closed, never handed to another episode. One background task keeps
``size`` idle containers plus one per waiting ``acquire()``; at most ``max_concurrency`` are leased at a time,
and with ``per_host_limit`` all pools of this process on the same Docker host together keep at most that many
containers (idle, starting, leased). A container that cannot be started is reported to the waiting
``acquire()`` as its exception (e.g. ``ImageNotFoundError``), and the pool retries after a short back-off.
The first pool of a process on a Docker host also runs ``reap_orphans()`` (containers of dead owners).

Envs do not hold pools themselves: they call ``acquire_sandbox(cfg)``. Inside ``async with warm_pools(size)``
(what the agent's episode runner opens, sized from its concurrency) that takes a container from a ``WarmPool``
keyed by the sandbox config (image, limits), made on first use; a config asked for a second time is kept warm
with ``size`` idle containers (so a set of one-off images, e.g. SWE-bench instances each seen once, never starts
containers nobody uses), never more than the episodes a finite run has left to start (``remaining``), and only
the ``max_warm`` most recently used configs keep idle containers. Leaving the
block removes every container of its pools. Outside such a block, and for bwrap, ``acquire_sandbox`` starts a
sandbox cold. ``use_pools(pools)`` installs a given set instead (the Ray backend's client of its node's sandbox
host, ``sao.trainer.cluster.sandbox_host``: the containers then live in that actor).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator

from sao.sandboxes.backend import make_sandbox
from sao.sandboxes.config import PoolConfig, SandboxConfig
from sao.sandboxes.docker import DockerSandbox, reap_orphans, run_blocking
from sao.sandboxes.protocols import Sandbox, SandboxError

_HOST_LIMITS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, int], asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)
_RETRY_BACKOFF_S = 1.0
_REAPED_HOSTS: set[tuple[int, str]] = set()


def host_limiter(docker_host: str | None, limit: int) -> asyncio.Semaphore:
    """The semaphore shared by every pool of this event loop on ``docker_host`` with this ``limit``."""
    loop = asyncio.get_running_loop()
    host = docker_host or os.environ.get("DOCKER_HOST") or "local"
    per_loop = _HOST_LIMITS.setdefault(loop, {})
    return per_loop.setdefault((host, limit), asyncio.Semaphore(limit))


class WarmPool:
    """Warm containers for one ``SandboxConfig`` (one image); see the module docstring."""

    def __init__(self, cfg: SandboxConfig, pool: PoolConfig | None = None) -> None:
        if cfg.backend != "docker":
            raise ValueError(f"sandbox.backend: a WarmPool holds Docker containers, got {cfg.backend!r}")
        self.cfg = cfg
        self.pool = pool or PoolConfig()
        self._idle: asyncio.Queue[DockerSandbox | BaseException] = asyncio.Queue()
        self._leases = asyncio.Semaphore(self.pool.max_concurrency)
        self._host: asyncio.Semaphore | None = None
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._starting: set[asyncio.Task[None]] = set()
        self._leased: set[DockerSandbox] = set()
        self._waiters = 0
        self._filler: asyncio.Task[None] | None = None
        self._closing = False

    async def start(self) -> WarmPool:
        """Begin filling the pool in the background (returns at once)."""
        if self.pool.per_host_limit is not None:
            self._host = host_limiter(self.cfg.docker_host, self.pool.per_host_limit)
        key = (os.getpid(), self.cfg.docker_host or os.environ.get("DOCKER_HOST") or "")
        if key not in _REAPED_HOSTS:
            # Once per process and host: remove what crashed runs of this host left behind.
            _REAPED_HOSTS.add(key)
            with contextlib.suppress(SandboxError):
                await run_blocking(reap_orphans, self.cfg.docker_host)
        self._filler = asyncio.create_task(self._fill(), name="sao-warm-pool")
        return self

    async def wait_warm(self, timeout: float = 120.0) -> None:
        """Wait until ``size`` containers are idle (benchmarks and tests)."""
        async with asyncio.timeout(timeout):
            while self._idle.qsize() < self.pool.size:
                await asyncio.sleep(0.02)

    @property
    def idle(self) -> int:
        return self._idle.qsize()

    @property
    def leased(self) -> int:
        return len(self._leased)

    async def _fill(self) -> None:
        while not self._closing:
            self._wake.clear()
            want = self.pool.size + self._waiters - self._idle.qsize() - len(self._starting)
            room = self.pool.size + self.pool.max_concurrency - len(self._leased) - self._idle.qsize()
            n = min(want, room - len(self._starting), self.pool.start_parallelism - len(self._starting))
            for _ in range(max(0, n)):
                task = asyncio.create_task(self._start_one())
                self._starting.add(task)
                task.add_done_callback(self._started)
            await self._wake.wait()

    def _started(self, task: asyncio.Task[None]) -> None:
        # Wake the filler only once the task has left `_starting`, or it would count it as still starting.
        self._starting.discard(task)
        self._wake.set()

    async def _start_one(self) -> None:
        if self._host is not None:
            await self._host.acquire()
        try:
            sb = await DockerSandbox.create(self.cfg, labels={"sao.pool": "warm"})
        except BaseException as e:
            if self._host is not None:
                self._host.release()
            if isinstance(e, asyncio.CancelledError):
                raise
            self._idle.put_nowait(e)
            await asyncio.sleep(_RETRY_BACKOFF_S)
            return
        self._idle.put_nowait(sb)

    async def acquire(self) -> DockerSandbox:
        """A started container, leased to the caller, who must ``close()`` it (it is then destroyed)."""
        if self._closing:
            raise SandboxError("acquire() on a closed WarmPool")
        if self._filler is None:
            await self.start()
        await self._leases.acquire()
        self._waiters += 1
        self._wake.set()
        try:
            item = await self._idle.get()
        except BaseException:
            self._leases.release()
            raise
        finally:
            self._waiters -= 1
        if isinstance(item, BaseException):
            self._leases.release()
            raise item
        item._on_close = lambda sb=item: self._returned(sb)
        self._leased.add(item)
        self._wake.set()
        return item

    def _returned(self, sb: DockerSandbox) -> None:
        self._leased.discard(sb)
        self._leases.release()
        if self._host is not None:
            self._host.release()
        if not self._leased:
            self._drained.set()
        self._wake.set()

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[DockerSandbox]:
        """``async with pool.lease() as sb``: acquire, then close (destroy) on exit."""
        sb = await self.acquire()
        try:
            yield sb
        finally:
            await sb.close()

    async def resize(self, size: int) -> None:
        """Keep ``size`` idle containers from now on; surplus idle ones are removed at once."""
        self.pool.size = size
        await self._remove_idle(keep=size)
        self._wake.set()

    async def _remove_idle(self, keep: int = 0) -> None:
        while self._idle.qsize() > keep:
            item = self._idle.get_nowait()
            if isinstance(item, DockerSandbox):
                with contextlib.suppress(SandboxError):
                    await item.close()
                if self._host is not None:
                    self._host.release()

    async def aclose(self, drain_timeout: float = 30.0) -> None:
        """Stop refilling, remove idle containers, wait up to ``drain_timeout`` s for leased ones to be closed,
        then remove those still out."""
        if self._closing:
            return
        self._closing = True
        self._wake.set()
        if self._filler is not None:
            await self._filler
        # Starts already sent to the daemon finish (cancelling them would leak the container being created).
        if self._starting:
            await asyncio.gather(*self._starting, return_exceptions=True)
        await self._remove_idle()
        if self._leased:
            self._drained.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), drain_timeout)
            await asyncio.gather(*(sb.close() for sb in list(self._leased)), return_exceptions=True)

    async def __aenter__(self) -> WarmPool:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


_ACTIVE: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, PoolSet] = weakref.WeakKeyDictionary()


def _key(cfg: SandboxConfig) -> str:
    return repr(cfg)  # every field: two configs share a pool only when their containers would be identical


class PoolSet:
    """Warm pools keyed by sandbox config for the envs of one episode runner (see the module docstring)."""

    def __init__(self, size: int, *, max_warm: int = 4, start_parallelism: int = 4) -> None:
        if size < 0 or max_warm < 1:
            raise ValueError(f"PoolSet: need size >= 0 and max_warm >= 1, got size={size}, max_warm={max_warm}")
        self.size, self.max_warm, self.start_parallelism = size, max_warm, start_parallelism
        self._pools: OrderedDict[str, WarmPool] = OrderedDict()  # least recently used first
        self._uses: dict[str, int] = {}
        self._lock = asyncio.Lock()
        self.stats = {"acquired": 0, "warm": 0}
        #: episodes still to start, when the caller knows (a finite run): no more idle containers than that.
        self.remaining: int | None = None

    @property
    def target(self) -> int:
        """Idle containers each warm pool keeps now."""
        return self.size if self.remaining is None else max(0, min(self.size, self.remaining))

    @property
    def pools(self) -> list[WarmPool]:
        return list(self._pools.values())

    async def acquire(self, cfg: SandboxConfig) -> Sandbox:
        """A fresh sandbox for ``cfg``: from its warm pool (Docker), or started cold (bwrap)."""
        if cfg.backend != "docker":
            return await make_sandbox(cfg)
        key = _key(cfg)
        async with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                limits = PoolConfig(size=0, max_concurrency=1 << 16, start_parallelism=self.start_parallelism)
                pool = await WarmPool(cfg, limits).start()
                self._pools[key] = pool
            self._pools.move_to_end(key)
            self._uses[key] = self._uses.get(key, 0) + 1
            if self._uses[key] >= 2 and pool.pool.size != self.target:
                await pool.resize(self.target)
            for cold in list(self._pools.values())[: -self.max_warm]:
                if cold.pool.size:
                    await cold.resize(0)
        self.stats["acquired"] += 1
        self.stats["warm"] += pool.idle > 0
        return await pool.acquire()

    async def aclose(self) -> None:
        """Remove every container of every pool (idle ones at once, leased ones after a short drain)."""
        pools, self._pools = list(self._pools.values()), OrderedDict()
        await asyncio.gather(*(p.aclose(drain_timeout=5.0) for p in pools), return_exceptions=True)


@contextlib.asynccontextmanager
async def warm_pools(size: int, *, max_warm: int = 4) -> AsyncIterator[PoolSet]:
    """Make ``acquire_sandbox`` use warm pools on this event loop until the block ends (nested blocks share one)."""
    loop = asyncio.get_running_loop()
    outer = _ACTIVE.get(loop)
    if outer is not None:
        outer.size = max(outer.size, size)
        yield outer
        return
    pools = PoolSet(size, max_warm=max_warm)
    _ACTIVE[loop] = pools
    try:
        yield pools
    finally:
        _ACTIVE.pop(loop, None)
        await pools.aclose()


@contextlib.asynccontextmanager
async def use_pools(pools: PoolSet) -> AsyncIterator[PoolSet]:
    """Make ``pools`` the set ``acquire_sandbox`` and nested ``warm_pools`` blocks use on this event loop until the
    block ends (e.g. the Ray backend's client of a node's sandbox host); the caller closes it."""
    loop = asyncio.get_running_loop()
    if loop in _ACTIVE:
        raise RuntimeError("use_pools: a pool set is already active on this event loop")
    _ACTIVE[loop] = pools
    try:
        yield pools
    finally:
        _ACTIVE.pop(loop, None)


def active_pools() -> PoolSet | None:
    """The ``warm_pools`` set open on the running event loop, if any."""
    try:
        return _ACTIVE.get(asyncio.get_running_loop())
    except RuntimeError:
        return None


async def acquire_sandbox(cfg: SandboxConfig) -> Sandbox:
    """A fresh sandbox for one episode: warm from the open ``warm_pools`` set, else started cold. Close it after."""
    pools = active_pools()
    if pools is not None:
        return await pools.acquire(cfg)
    return await make_sandbox(cfg)
