"""Sandbox hosts: one Ray actor per rollout node that owns the node's Docker engine and its warm pools.

The rollout workers of a node never talk to Docker themselves: their envs' ``acquire_sandbox(cfg)`` goes to the
node's host (``SandboxHostClient``, installed with ``sao.sandboxes.pool.use_pools``), which leases a container from its
``PoolSet`` and hands back an id; every later call of the episode (``exec``, ``exec_as_root``, ``read_file``,
``write_file``, ``copy_in``, ``copy_out``, ``close``) is an actor call that the host runs on that container
(``RemoteSandbox``). The host, not a handle passed around, holds the container, so:

- the warm pool is per node and shared by all the node's rollout workers;
- a host that dies (crash, OOM, ``ray kill``) fails every call on its sandboxes with ``SandboxUnavailableError``
  naming it; an episode whose sandbox was on a host that died is an ``infra_error`` record even when the env
  swallowed the error (e.g. in its teardown): ``episode_sandboxes`` collects each episode's sandboxes;
- Ray restarts the host (``cluster.sandbox_host_restarts``): new episodes get sandboxes from the new incarnation,
  whose first pool removes the containers its dead predecessor left (``reap_orphans``); once the restarts are used
  up (the host does not answer for ``restart_wait_s``) the client reports ``lost`` and rank 0 stops sending
  episodes to the node's workers.

Paths given to ``copy_in`` / ``copy_out`` are on the host's node, which is the worker's node.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import uuid
from typing import Any

from sao.sandboxes.config import SandboxConfig
from sao.sandboxes.pool import PoolSet
from sao.sandboxes.protocols import ExecResult, RootCommands, Sandbox, SandboxError, SandboxUnavailableError

#: the sandboxes the current episode took from a sandbox host (set by the rollout worker around each episode)
episode_sandboxes: contextvars.ContextVar[list[RemoteSandbox] | None] = contextvars.ContextVar(
    "sao_episode_sandboxes", default=None
)


class SandboxHostImpl:
    """The actor body: this node's warm pools and the containers leased from them, by id."""

    def __init__(self, pool_size: int, max_warm: int = 4) -> None:
        self.pools = PoolSet(pool_size, max_warm=max_warm)
        self.boxes: dict[str, Sandbox] = {}
        self.incarnation = uuid.uuid4().hex[:8]

    async def ping(self) -> dict[str, Any]:
        import ray

        node = ray.get_runtime_context().get_node_id()
        return {"node": node, "pid": os.getpid(), "incarnation": self.incarnation, "leased": len(self.boxes)}

    async def acquire(self, cfg: SandboxConfig) -> str:
        sb = await self.pools.acquire(cfg)
        sid = uuid.uuid4().hex
        self.boxes[sid] = sb
        return sid

    def _box(self, sid: str) -> Sandbox:
        sb = self.boxes.get(sid)
        if sb is None:
            raise SandboxUnavailableError(
                f"sandbox {sid[:8]} is not on this sandbox host (incarnation {self.incarnation}): the host "
                "restarted since it was made, and its containers went with the old incarnation"
            )
        return sb

    async def exec(
        self, sid: str, cmd: str, timeout: float, workdir: str | None, env: dict[str, str] | None
    ) -> ExecResult:
        return await self._box(sid).exec(cmd, timeout=timeout, workdir=workdir, env=env)

    async def exec_as_root(self, sid: str, argv: list[str], timeout: float, stdin: bytes) -> tuple[int, str]:
        box = self._box(sid)
        if not isinstance(box, RootCommands):
            raise SandboxError(f"sandbox {sid[:8]} ({type(box).__name__}) cannot run root's steps (exec_as_root)")
        return await box.exec_as_root(argv, timeout=timeout, stdin=stdin)

    async def read_file(self, sid: str, path: str) -> str:
        return await self._box(sid).read_file(path)

    async def write_file(self, sid: str, path: str, content: str) -> None:
        await self._box(sid).write_file(path, content)

    async def copy_in(self, sid: str, src: str, dest: str) -> None:
        await self._box(sid).copy_in(src, dest)

    async def copy_out(self, sid: str, src: str, dest: str) -> None:
        await self._box(sid).copy_out(src, dest)

    async def close(self, sid: str) -> None:
        sb = self._box(sid)
        del self.boxes[sid]
        await sb.close()

    async def shutdown(self) -> None:
        """Remove every container of this host (leased ones too)."""
        boxes, self.boxes = list(self.boxes.values()), {}
        await asyncio.gather(*(b.close() for b in boxes), return_exceptions=True)
        await self.pools.aclose()


def _host_died(name: str, e: BaseException) -> SandboxUnavailableError:
    return SandboxUnavailableError(f"sandbox host {name} died ({type(e).__name__}); the episode's sandbox is gone")


class RemoteSandbox:
    """One container on a sandbox host, driven by actor calls (the ``Sandbox`` protocol)."""

    def __init__(self, client: SandboxHostClient, sid: str) -> None:
        self.client, self.sid = client, sid
        self.failed: str | None = None  # why the host lost this sandbox, once it did
        self._closed = False

    async def _call(self, method: str, *args: Any) -> Any:
        import ray

        try:
            return await getattr(self.client.host, method).remote(self.sid, *args)
        except ray.exceptions.RayTaskError as e:  # the host ran the call and it raised: re-raise the cause's type
            cause = e.cause
            if isinstance(cause, SandboxUnavailableError):
                self.failed = str(cause)
            if isinstance(cause, Exception):
                raise cause from None
            raise
        except ray.exceptions.RayActorError as e:
            err = _host_died(self.client.name, e)
            self.failed = str(err)
            raise err from e

    async def exec(
        self, cmd: str, timeout: float = 60.0, workdir: str | None = None, env: dict[str, str] | None = None
    ) -> ExecResult:
        result: ExecResult = await self._call("exec", cmd, timeout, workdir, env)
        return result

    async def exec_as_root(self, argv: list[str], timeout: float = 120.0, stdin: bytes = b"") -> tuple[int, str]:
        result: tuple[int, str] = await self._call("exec_as_root", argv, timeout, stdin)
        return result

    async def read_file(self, path: str) -> str:
        text: str = await self._call("read_file", path)
        return text

    async def write_file(self, path: str, content: str) -> None:
        await self._call("write_file", path, content)

    async def copy_in(self, src: str, dest: str) -> None:
        await self._call("copy_in", src, dest)

    async def copy_out(self, src: str, dest: str) -> None:
        await self._call("copy_out", src, dest)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._call("close")

    async def __aenter__(self) -> RemoteSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class SandboxHostClient(PoolSet):
    """A rollout worker's pool set whose containers live on its node's sandbox host (see the module docstring)."""

    def __init__(self, host: Any, name: str, restart_wait_s: float = 120.0) -> None:
        super().__init__(0)
        self.host, self.name, self.restart_wait_s = host, name, restart_wait_s
        self.lost: str | None = None  # set once the host is gone for good (restarts used up, node lost)

    async def acquire(self, cfg: SandboxConfig) -> Sandbox:
        if cfg.backend != "docker":
            from sao.sandboxes.factory import make_sandbox

            return await make_sandbox(cfg)
        import ray

        if self.lost is not None:
            raise SandboxUnavailableError(self.lost)
        try:
            sid = await self._acquire(cfg)
        except ray.exceptions.RayActorError as e:
            # Died while starting our container: wait for Ray's restart, once; a host that does not come back is lost.
            if not await self._alive():
                self.lost = f"sandbox host {self.name} is gone ({type(e).__name__}) and was not restarted"
                raise SandboxUnavailableError(self.lost) from e
            try:
                sid = await self._acquire(cfg)
            except ray.exceptions.RayActorError as e2:
                raise _host_died(self.name, e2) from e2
        self.stats["acquired"] += 1
        box = RemoteSandbox(self, sid)
        mine = episode_sandboxes.get()
        if mine is not None:
            mine.append(box)
        return box

    async def _acquire(self, cfg: SandboxConfig) -> str:
        import ray

        try:
            sid: str = await self.host.acquire.remote(cfg)
            return sid
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, SandboxError):
                raise e.cause from None
            raise

    async def _alive(self) -> bool:
        """Whether the host answers within ``restart_wait_s`` (a call sent while Ray has not yet marked the host
        as restarting fails like one to a dead host, so one failed ping proves nothing: retry until the deadline)."""
        import ray

        deadline = asyncio.get_running_loop().time() + self.restart_wait_s
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            try:
                await asyncio.wait_for(asyncio.wrap_future(self.host.ping.remote().future()), left)
                return True
            except ray.exceptions.RayActorError:
                await asyncio.sleep(min(1.0, max(0.0, left)))
            except TimeoutError:
                return False
        return False

    async def aclose(self) -> None:
        """Nothing to remove here: the host owns the pools (each sandbox is closed by its episode)."""
