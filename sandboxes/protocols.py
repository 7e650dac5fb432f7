"""The Sandbox seam: what envs may ask of an isolated machine, and the typed errors it raises."""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, runtime_checkable


class SandboxError(RuntimeError):
    """The sandbox itself failed (daemon unreachable, container gone, image missing): an infra error,
    never a property of the agent's command."""


class ImageNotFoundError(SandboxError):
    """An image could be neither found locally, built nor pulled."""


class SandboxUnavailableError(SandboxError):
    """The backend (Docker daemon, bwrap binary) cannot be reached or is not installed."""


class SandboxDiedError(RuntimeError):
    """The sandbox died during (or right after) one of the agent's own commands while its backend is healthy.

    Not a ``SandboxError``: commands run as an unprivileged user that cannot signal the sandbox's PID 1, so what
    is left is something the command caused (an escape, the memory killer taking the container's init, a
    background process it left); the episode is scored as a failure with this message as its reason, never
    dropped as an infra error (a dropped failure is an exit a policy can learn to take)."""


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one command. ``output`` is stdout+stderr interleaved, capped (head + tail kept around a
    marker) when ``truncated``; ``timed_out`` means the command was killed at its timeout (exit_code then 124);
    ``oom_killed``: the kernel killed it (or one of its processes) for the sandbox's memory limit;
    ``disk_full``: the sandbox's written bytes passed ``disk_limit`` while it ran and its processes were killed."""

    exit_code: int
    output: str
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0
    oom_killed: bool = False
    disk_full: bool = False


@runtime_checkable
class Sandbox(Protocol):
    """An isolated machine for one episode. Use as ``async with``; ``close`` destroys it."""

    async def exec(
        self,
        cmd: str,
        timeout: float = 60.0,
        workdir: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult: ...

    async def read_file(self, path: str) -> str: ...

    async def write_file(self, path: str, content: str) -> None: ...

    async def copy_in(self, src: str, dest: str) -> None: ...

    async def copy_out(self, src: str, dest: str) -> None: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


@runtime_checkable
class RootCommands(Protocol):
    """A sandbox that runs its owner's own trusted steps as the container's root (Docker: ``exec_as_root``), e.g. the
    SWE env keeping its repository's base and the grader writing its eval script out of the agent's reach."""

    async def exec_as_root(self, argv: list[str], timeout: float = 120.0, stdin: bytes = b"") -> tuple[int, str]: ...
