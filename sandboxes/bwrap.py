"""BwrapSandbox: commands in a bubblewrap jail on the host, for machines without Docker.

Each command runs as ``bwrap ... <shell> -c <cmd>`` with:
- a fresh root (tmpfs) holding read-only binds of the host's ``/usr``, ``/etc`` and the ``/bin``, ``/lib*``
  links (plus ``SandboxConfig.bwrap_ro_binds``): the host's home folders, ``/root``, ``/var``, ``/opt``, the
  checkout and other users' files are not visible at all;
- one writable directory, a host temp dir made per sandbox and bound at ``/work`` (the working directory;
  ``HOME=/work``); files there persist across the sandbox's commands and are removed by ``close()``;
  a private ``/tmp`` (tmpfs) per command, fresh ``/dev`` and ``/proc``. Each command is its own jail: processes
  it leaves in the background die when it exits (unlike Docker, where they live on in the container);
- every namespace unshared (``--unshare-all``): no network but loopback (unless ``network="host"``), own PIDs,
  IPC, UTS and user namespace; ``--die-with-parent`` (the jail dies with this process) and ``--new-session`` (no
  terminal injection); ``--cap-drop ALL``: run by root, bwrap would otherwise keep every capability inside the
  jail's user namespace (enough to mount a tmpfs or make namespaces); with none, root inside cannot mount or
  remount anything;
- the command runs as the unprivileged ``SandboxConfig.user`` (default 1000:1000) of its own user namespace
  (``--unshare-user --uid --gid``), mapped to the host user running sao; it can signal only its own jail, whose
  PID 1 ignores it: killing every process ends the command, never the sandbox;
- a clean environment (``--clearenv``: PATH, HOME, LANG and ``SandboxConfig.env`` only);
- a memory cap as ``ulimit -v`` (address space, ``mem_limit``) and a timeout that kills the whole jail;
- disk: ``ulimit -f`` of ``disk_limit`` (a bigger file is refused), ``/tmp`` a tmpfs of that size, and ``/work``
  measured every ``disk_check_s`` while a command runs: past the limit and growing, the jail is killed
  (``ExecResult.disk_full``); ``write_file`` past it raises ``OSError(ENOSPC)``.

What it does NOT isolate: the kernel (shared, as with Docker); CPU time (no CPU limit without cgroups); the
number of processes (no pids limit: a fork bomb is only stopped by the timeout, and can slow the host until
then); everything readable under ``/usr`` and ``/etc`` by the host user the jail's user maps to (run as root,
that includes ``/etc/shadow``: the mapped user owns root's files, without any capability); the memory killer
(no cgroup: ``ulimit -v`` makes an allocation fail instead, e.g. ``MemoryError``). ``ulimit -v`` limits address
space, not resident memory, so some runtimes (Go, JVMs) fail early under it. Use Docker when these matter. SWE
tasks refuse this backend (``SWEEnv`` needs ``sandbox.backend="docker"``): a task is an image (its repository,
its Python environment, the grader's fresh container), which a jail over the host's ``/usr`` cannot hold; math
episodes need none of that and their grader (math-verify) runs in the host process, out of the jail's reach.

Requires the ``bubblewrap`` Debian package (``apt-get install bubblewrap``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import posixpath
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from sao.sandboxes.config import SandboxConfig
from sao.sandboxes.output import OutputCapper
from sao.sandboxes.protocols import ExecResult, SandboxError, SandboxUnavailableError

WORK_MOUNT = "/work"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def bwrap_path() -> str:
    """The bwrap binary, or ``SandboxUnavailableError`` saying how to install it."""
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailableError(
            "bubblewrap is not installed: run `apt-get install bubblewrap` (or use sandbox.backend=docker)"
        )
    return path


def _root_args(extra_ro: tuple[str, ...]) -> list[str]:
    args = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        p = Path("/") / top
        if p.is_symlink():  # merged-/usr systems: /bin -> usr/bin
            args += ["--symlink", os.readlink(p), str(p)]
        elif p.is_dir():
            args += ["--ro-bind", str(p), str(p)]
    for extra in extra_ro:
        args += ["--ro-bind", extra, extra]
    return args


class _MarkedOutput:
    """The jail's output without bwrap's start marker: ``started`` is None until the output shows whether it begins
    with the marker (True: the command ran; False: bwrap's own output)."""

    def __init__(self, marker: bytes, capper: OutputCapper) -> None:
        self.marker, self.capper = marker, capper
        self.head = bytearray()  # the output until it shows whether it starts with the marker
        self.started: bool | None = None

    def feed(self, chunk: bytes) -> None:
        if self.started is None:
            self.head.extend(chunk)
            if len(self.head) < len(self.marker) and self.marker.startswith(bytes(self.head)):
                return
            self.started = self.head.startswith(self.marker)
            chunk = bytes(self.head[len(self.marker) :] if self.started else self.head)
        self.capper.feed(chunk)


class BwrapSandbox:
    """A bubblewrap jail with a persistent writable ``/work``; see the module docstring for what it isolates."""

    def __init__(self, cfg: SandboxConfig) -> None:
        self.cfg = cfg
        self.bwrap = bwrap_path()
        self.host_workdir = Path(tempfile.mkdtemp(prefix="sao-bwrap-"))
        self._marker = f"\036sao-started-{secrets.token_hex(8)}\n".encode()
        self._closed = False

    @classmethod
    async def create(cls, cfg: SandboxConfig) -> BwrapSandbox:
        return cls(cfg)

    def argv(self, cmd: str, workdir: str | None, env: dict[str, str] | None) -> list[str]:
        """The full bwrap command line for ``cmd`` (public for inspection and tests)."""
        args = [self.bwrap, *_root_args(self.cfg.bwrap_ro_binds)]
        args += ["--dev", "/dev", "--proc", "/proc", "--size", str(self.cfg.disk_bytes), "--tmpfs", "/tmp"]
        args += ["--bind", str(self.host_workdir), WORK_MOUNT, "--chdir", WORK_MOUNT]
        uid, gid = self.cfg.user.split(":")
        args += ["--unshare-all", "--unshare-user", "--uid", uid, "--gid", gid]
        args += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        if self.cfg.network == "host":
            args += ["--share-net"]
        args += ["--clearenv", "--setenv", "PATH", _PATH, "--setenv", "HOME", WORK_MOUNT, "--setenv", "LANG", "C.UTF-8"]
        for k, v in {**self.cfg.env, **(env or {})}.items():
            args += ["--setenv", k, v]
        kib = self.cfg.mem_bytes // 1024
        blocks = max(1, self.cfg.disk_bytes // 512)
        # `ulimit` before exec: the limits bind the command and all its children; they cannot raise them.
        # The shell (not bwrap) changes directory, so a missing workdir is the command's failure (exit 126, as
        # Docker reports it), not a sandbox failure.
        # The marker first: printed inside the jail, it says bwrap's setup is over, so a failure without it is
        # bwrap's own (infra); one with it is the command's, whatever it prints (it cannot unprint the marker).
        wrapper = 'printf "$1"; ulimit -v "$2" && ulimit -f "$3" || exit 126; cd "$4" || exit 126; shift 4; exec "$@"'
        cwd = workdir or self.cfg.workdir or WORK_MOUNT
        args += ["/bin/sh", "-c", wrapper, "sh", self._marker.decode(), str(kib), str(blocks), cwd]
        args += [*self.cfg.shell, cmd]
        return args

    async def exec(
        self, cmd: str, timeout: float = 60.0, workdir: str | None = None, env: dict[str, str] | None = None
    ) -> ExecResult:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
        if self._closed:
            raise SandboxError("exec on a closed sandbox")
        t0 = time.monotonic()
        proc = await self._spawn(cmd, workdir, env)
        output = _MarkedOutput(self._marker, OutputCapper(self.cfg.output_cap_bytes))
        used_before = await asyncio.to_thread(self.disk_used)

        def over() -> bool:
            # Over the limit and still growing: a command that only reads or deletes may run while over it.
            used = self.disk_used()
            return used > self.cfg.disk_bytes and used > used_before

        timed_out, disk_full = await self._pump(proc, output, over, timeout)
        code, timed_out = await self._reap(proc, timed_out, timeout)
        capper = output.capper
        out = capper.text()
        if output.started is None:  # the output ended before the marker was complete
            capper.feed(bytes(output.head))
        if not timed_out and code != 0 and not output.started:
            # bwrap itself failed (not the command): e.g. no user namespaces on this kernel.
            raise SandboxUnavailableError(f"bwrap cannot run here: {out.strip()[:500]}")
        return ExecResult(
            exit_code=124 if timed_out else (128 - code if code < 0 else code),
            output=out,
            timed_out=timed_out,
            truncated=capper.truncated,
            duration_s=time.monotonic() - t0,
            disk_full=disk_full or await asyncio.to_thread(over),
        )

    async def _spawn(self, cmd: str, workdir: str | None, env: dict[str, str] | None) -> asyncio.subprocess.Process:
        """bwrap running ``cmd``, in a session of its own (one ``killpg`` ends the jail), output on one pipe."""
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv(cmd, workdir, env),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as e:
            raise SandboxUnavailableError(f"bwrap could not be started ({e}); reinstall bubblewrap") from e
        assert proc.stdout is not None
        return proc

    async def _pump(
        self, proc: asyncio.subprocess.Process, output: _MarkedOutput, over: Callable[[], bool], timeout: float
    ) -> tuple[bool, bool]:
        """Read the output until it ends, ``timeout`` passes or ``over()`` (checked every ``disk_check_s``) kills
        the jail; the jail is killed on the way out unless it ended. Returns (timed out, disk full)."""
        disk_full = False

        async def pump() -> None:
            assert proc.stdout is not None
            while chunk := await proc.stdout.read(256 * 1024):
                output.feed(chunk)

        async def watch_disk() -> None:
            nonlocal disk_full
            while True:
                await asyncio.sleep(self.cfg.disk_check_s)
                if await asyncio.to_thread(over):
                    disk_full = True
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    return

        timed_out = False
        watcher = asyncio.create_task(watch_disk())
        try:
            await asyncio.wait_for(pump(), timeout)
        except TimeoutError:
            timed_out = not disk_full
        finally:
            watcher.cancel()
            if timed_out or proc.returncode is None:
                # Killing bwrap kills the jail's PID 1, which takes every process of the jail with it.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        return timed_out, disk_full

    async def _reap(self, proc: asyncio.subprocess.Process, timed_out: bool, timeout: float) -> tuple[int, bool]:
        """(exit code, timed out): bwrap's exit, killed again if it does not come in time."""
        try:
            code = await asyncio.wait_for(proc.wait(), self.cfg.kill_grace_s if timed_out else timeout + 1)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            code = await proc.wait()
            timed_out = True
        return code, timed_out

    def disk_used(self) -> int:
        """Bytes of the files under ``/work`` (the only writable place that outlives a command)."""
        total = 0
        for root, _, files in os.walk(self.host_workdir):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(root, name)).st_size
        return total

    def _host_path(self, path: str) -> Path:
        """The host path behind ``path`` (absolute under /work, or relative to it); SandboxError elsewhere."""
        norm = posixpath.normpath(path if path.startswith("/") else f"{WORK_MOUNT}/{path}")
        if norm != WORK_MOUNT and not norm.startswith(WORK_MOUNT + "/"):
            raise SandboxError(f"{path} is outside {WORK_MOUNT}, the only writable place of a bwrap sandbox")
        host = self.host_workdir / norm[len(WORK_MOUNT) :].lstrip("/")
        # A symlink made inside the jail must not lead a host-side write out of the workdir.
        if not host.resolve().is_relative_to(self.host_workdir.resolve()):
            raise SandboxError(f"{path} resolves outside {WORK_MOUNT}")
        return host

    async def read_file(self, path: str) -> str:
        """A file under ``/work`` is read directly; anything else is read through the jail (``cat``)."""
        if path.startswith(WORK_MOUNT + "/") or not path.startswith("/"):
            host = self._host_path(path)
            if not host.exists():
                raise FileNotFoundError(f"{path} does not exist in the sandbox")
            if host.stat().st_size > self.cfg.read_limit_bytes:
                raise OSError(errno.EFBIG, f"{path} is over sandbox.read_limit_bytes")
            return host.read_text(errors="replace")
        res = await self.exec(f"cat -- '{path}'", timeout=30)
        if res.exit_code != 0:
            raise FileNotFoundError(f"{path} cannot be read in the sandbox: {res.output.strip()}")
        return res.output

    async def write_file(self, path: str, content: str) -> None:
        """Write under ``/work`` (relative paths too); elsewhere the jail is read-only: SandboxError. Past
        ``disk_limit`` (what ``/work`` holds plus the new content): ``OSError(ENOSPC)``, the agent's business."""
        host = self._host_path(path)
        data = content.encode("utf-8")
        if await asyncio.to_thread(self.disk_used) + len(data) > self.cfg.disk_bytes:
            raise OSError(errno.ENOSPC, f"{path}: over the sandbox's disk limit (sandbox.disk_limit)")
        host.parent.mkdir(parents=True, exist_ok=True)
        host.write_bytes(data)

    async def copy_in(self, src: str, dest: str) -> None:
        host = self._host_path(dest)
        host.parent.mkdir(parents=True, exist_ok=True)
        if Path(src).is_dir():
            await asyncio.to_thread(shutil.copytree, src, host, symlinks=True, dirs_exist_ok=True)
        elif Path(src).is_file():
            await asyncio.to_thread(shutil.copy2, src, host)
        else:
            raise FileNotFoundError(f"copy_in: host path {src} does not exist")

    async def copy_out(self, src: str, dest: str) -> None:
        host = self._host_path(src)
        if host.is_dir():
            await asyncio.to_thread(shutil.copytree, host, dest, symlinks=True)
        elif host.is_file():
            await asyncio.to_thread(shutil.copy2, host, dest)
        else:
            raise FileNotFoundError(f"{src} does not exist in the sandbox")

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await asyncio.to_thread(shutil.rmtree, self.host_workdir, True)

    async def __aenter__(self) -> BwrapSandbox:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
