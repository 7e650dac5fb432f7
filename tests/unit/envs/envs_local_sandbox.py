"""A tiny local-subprocess Sandbox for unit tests of tools and envs (no isolation; tests only)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import TracebackType

from sao.sandboxes.protocols import ExecResult, SandboxError


class LocalSandbox:
    """Runs ``bash -c`` in a temp folder on this machine. ``fail`` makes every call raise a SandboxError."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.closed = False
        self.fail = False
        self.commands: list[str] = []

    async def exec(
        self, cmd: str, timeout: float = 60.0, workdir: str | None = None, env: dict[str, str] | None = None
    ) -> ExecResult:
        if self.fail or self.closed:
            raise SandboxError("local sandbox is gone")
        self.commands.append(cmd)
        t0 = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            cmd,
            cwd=workdir or self.root,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return ExecResult(124, "", timed_out=True, duration_s=time.monotonic() - t0)
        except asyncio.CancelledError:  # the env's wall-time limit cancelled the turn
            proc.kill()
            await proc.wait()
            raise
        return ExecResult(int(proc.returncode or 0), out.decode(errors="replace"), duration_s=time.monotonic() - t0)

    async def read_file(self, path: str) -> str:
        if self.fail:
            raise SandboxError("local sandbox is gone")
        return Path(path).read_text()

    async def write_file(self, path: str, content: str) -> None:
        if self.fail:
            raise SandboxError("local sandbox is gone")
        Path(path).write_text(content)

    async def copy_in(self, src: str, dest: str) -> None:
        raise NotImplementedError

    async def copy_out(self, src: str, dest: str) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        self.closed = True

    async def __aenter__(self) -> LocalSandbox:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
