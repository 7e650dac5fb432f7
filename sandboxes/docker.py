"""DockerSandbox: one locked-down container per episode, driven through the Docker Engine API.

What it isolates (per container): the filesystem (the image's own root, nothing of the host mounted), the network
(``network_mode="none"`` by default: loopback only), processes (own PID namespace, ``pids_limit``), memory
(cgroup limit, swap included), CPU (``nano_cpus``), privileges (every capability dropped, ``no-new-privileges``).
Commands run as an unprivileged user (``SandboxConfig.user``, default uid:gid 1000:1000, ``HOME`` ``AGENT_HOME``):
the kernel clears its capabilities at exec, so it cannot signal PID 1 (the init), the container's ``sleep`` or
anything else root runs, and so cannot stop its own sandbox (``kill -9 -1`` kills only its own processes). Root
does one thing, before any command: it resolves the user and makes its home and the working directory
(``SandboxConfig.workdir``, else the image's ``WORKDIR`` unless ``/``, else ``AGENT_HOME``) and any
``SandboxConfig.owned_paths`` the image has its own (``chown -R`` when the image has them root's: the only
capability root keeps is ``CHOWN``). ``write_file`` runs as that user too
(through the exec's stdin), so the editor may write only where ``bash`` may. If the container still stops during a
command while the daemon answers, that is the command's doing: ``SandboxDiedError`` (scored), while a removed
container or a lost daemon is a ``SandboxError``.
What it does NOT isolate: the kernel (a kernel exploit escapes, as with any container); files the image leaves
world-writable or readable; ``read_file`` reads as the daemon (any file of the container).

Disk: every command runs under ``ulimit -f`` of ``disk_limit`` (a bigger file is refused at once: ``File size
limit exceeded`` / ``File too large``), and ``_DiskWatch`` measures the writable layer of every sandbox of this
process every ``disk_check_s`` (between commands too) and kills the user's processes when what the episode wrote
passes ``disk_limit`` (``ExecResult.disk_full``); overlay2 on ext4 has no per-container quota to do it instead.
With a local daemon it also freezes the sandboxes as soon as the host's free disk drops faster than they may
write, so a fast writer is stopped within ~0.1 s instead of a period (see ``_DiskWatch``).
Memory: a command, or one of its processes, killed by the cgroup's OOM killer sets ``ExecResult.oom_killed``
(the memory cgroup's ``oom_kill`` counter, read by the exec wrapper after the command).

Commands run as ``timeout -s KILL <t> sh -c <wrapper> sh <blocks> <shell> -c <cmd>`` (the wrapper sets the file
size limit, merges stderr into stdout, in order, and reports the OOM counter on its own stderr): at the timeout the
command's process group is killed
and the container lives on (``ExecResult(exit_code=124, timed_out=True)``). Something that escaped the process
group and still holds the output open is killed too, ``kill_grace_s`` later (``kill -9 -1`` as the user). Output
is read from the exec's connection as it comes (``exec_start(socket=True)``, docker-py's public handle on it; each
exec waits for a gate line on its stdin before it prints, so nothing it prints can be caught in the HTTP client's
buffer) and capped (head + tail) so a command printing gigabytes costs the host ``output_cap_bytes``. Containers
carry the labels ``sao.owner=sao``, ``sao.owner_pid`` and ``sao.owner_host``;
``reap_orphans()`` removes those whose owner process is gone.

Daemon restarts: a command running when the daemon goes away raises ``SandboxUnavailableError`` (the episode is an
infra error); creating a sandbox while a daemon that answered before is unreachable waits for it, up to
``SandboxConfig.daemon_wait_s``, so a run pauses through a restart instead of failing every new episode; a sandbox
closed while the daemon is away is removed by the next one made on that daemon.

Blocking SDK calls run on a dedicated thread pool (not the event loop's small default one), so 32 concurrent
episodes do not queue behind each other. ``DOCKER_HOST`` (or ``SandboxConfig.docker_host``) picks the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import os
import re
import select
import signal
import socket
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import docker
import docker.errors
import requests

from sao.core.retry import RetryError, poll_until
from sao.core.tether import pid_alive
from sao.sandboxes.base_image import base_image_tag, missing_image
from sao.sandboxes.config import SandboxConfig
from sao.sandboxes.output import OutputCapper
from sao.sandboxes.protocols import (
    ExecResult,
    SandboxDiedError,
    SandboxError,
    SandboxUnavailableError,
)

T = TypeVar("T")
OWNER_LABEL = "sao.owner"
OWNER_PID_LABEL = "sao.owner_pid"
OWNER_HOST_LABEL = "sao.owner_host"
TIMEOUT_EXIT = 124
_KILL_EXIT = 137  # 128 + SIGKILL: what `timeout -s KILL` (and the OOM killer) leave behind
_ERR_CAP = 4096
AGENT_HOME = "/home/sao"  # HOME and default working directory of the commands' user, made at start
# Kept from cap_drop=ALL for root only, and used only by `_PREPARE` at start: commands run as an unprivileged
# user, whose capabilities the kernel clears at exec (no ambient set, no-new-privileges).
_ROOT_CAPS = ("CHOWN",)
# The first thing every exec does: wait for the line `_ExecStream.send_stdin` sends once the exec's stream is ours
# (see there). `read` takes its input a byte at a time from a socket, so what follows stays for the command.
_GATE = "IFS= read -r _sao_gate || :"
# Run as root once at start, before any command: resolve the user, give it its home and the working directory.
_PREPARE = (
    _GATE
    + r"""
set -e
case "$1" in *:*) uid=${1%%:*}; gid=${1#*:} ;; *) uid=$(id -u "$1"); gid=$(id -g "$1") ;; esac
mkdir -p "$2" && chown "$uid:$gid" "$2"
if [ -n "$3" ]; then
  mkdir -p "$3"
  [ "$(stat -c %u:%g "$3")" = "$uid:$gid" ] || chown -R "$uid:$gid" "$3"
fi
shift 3
for p in "$@"; do
  [ -e "$p" ] || continue
  [ "$(stat -c %u:%g "$p")" = "$uid:$gid" ] || chown -R "$uid:$gid" "$p"
done
echo "$uid:$gid"
"""
)
# Wraps every command: the file size limit (512-byte blocks), stderr into stdout (one ordered stream), then the
# memory cgroup's OOM-kill counter on the exec's own stderr, which the command no longer holds.
_WRAPPER = (
    _GATE + '; ulimit -f "$1" || exit 126; shift; "$@" 2>&1; rc=$?; '
    "cat /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control >&2 2>/dev/null; exit $rc"
)

_EXECUTOR = ThreadPoolExecutor(max_workers=128, thread_name_prefix="sao-docker")
_CLIENTS: dict[tuple[int, str], Any] = {}
_CLIENTS_LOCK = threading.Lock()
_ANSWERED: set[str] = set()  # daemons that answered this process once: a later outage is a restart, worth waiting
_PENDING_REMOVAL: dict[str, set[str]] = {}  # daemon -> containers closed while it was unreachable


def _host_key(docker_host: str | None) -> str:
    return docker_host or os.environ.get("DOCKER_HOST") or ""


async def run_blocking(fn: Callable[..., T], *args: Any) -> T:
    """Run a blocking Docker call on the sandbox thread pool."""
    return await asyncio.get_running_loop().run_in_executor(_EXECUTOR, fn, *args)


def _unavailable(host: str | None, e: BaseException) -> SandboxUnavailableError:
    where = host or os.environ.get("DOCKER_HOST") or "the local socket (/var/run/docker.sock)"
    return SandboxUnavailableError(
        f"the Docker daemon at {where} cannot be reached ({type(e).__name__}: {e}); start dockerd "
        "(`python -m sao.core.setup docker`) or point DOCKER_HOST at a running daemon, or use sandbox.backend=bwrap"
    )


def get_client(docker_host: str | None = None) -> Any:
    """A cached Docker SDK client for ``docker_host`` (``None``: ``DOCKER_HOST``/local socket); blocking.

    Raises ``SandboxUnavailableError`` when the daemon does not answer."""
    host = _host_key(docker_host)
    key = (os.getpid(), host)
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is not None:
            return client
        env = dict(os.environ)
        if docker_host:
            env["DOCKER_HOST"] = docker_host
        try:
            # A pool bigger than the default 10: each running exec holds one connection.
            client = docker.from_env(environment=env, max_pool_size=256, timeout=120)
            client.ping()
        except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as e:
            raise _unavailable(docker_host, e) from e
        _CLIENTS[key] = client
        _ANSWERED.add(host)
        return client


class _ExecStream:
    """The connection of one exec, as ``APIClient.exec_start(socket=True)`` hands it over ("the connection socket to
    allow custom read/write operations"): a ``SocketIO`` for unix sockets and plain tcp, an SSL socket for https, a
    channel for ssh. Read and written through their public methods only.

    Every exec made here waits for one line on its stdin before it prints anything (``_GATE``), sent once
    ``exec_start`` has returned, so no output can arrive with the upgrade response and be buffered out of reach by
    the HTTP client (seen under load before the gate: a quick command's output lost, "exit 0" with nothing printed)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def fileno(self) -> int:
        return int(self.conn.fileno())

    def pending(self) -> int:
        pending = getattr(self.conn, "pending", None)  # TLS: bytes decrypted and buffered, invisible to poll()
        return int(pending()) if pending else 0

    def recv(self, n: int) -> bytes | None:
        """Up to ``n`` bytes; ``b""`` at EOF; ``None`` when nothing is there yet."""
        recv = getattr(self.conn, "recv", None)
        return recv(n) if recv else self.conn.read(n)  # type: ignore[no-any-return]

    def send_stdin(self, data: bytes) -> None:
        """Open the gate, feed ``data`` to the command's stdin, then close it (the command reads EOF after)."""
        if hasattr(self.conn, "sendall"):  # a socket (TLS included) or an ssh channel
            self.conn.sendall(b"\n" + data)
            self.conn.shutdown(socket.SHUT_WR)
            return
        # A SocketIO is read-only: a second handle on its connection writes (closing it closes only the handle).
        with socket.socket(fileno=os.dup(self.fileno())) as conn:
            conn.sendall(b"\n" + data)
            conn.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


class _Framer:
    """Incremental parser of Docker's multiplexed exec stream: frames of an 8-byte header (stream, 0, 0, 0,
    big-endian payload length) and a payload. Payloads go to the capper, stdout and stderr interleaved; with
    ``err`` given, stderr frames go there instead (the exec wrapper reports on stderr, the command on stdout)."""

    def __init__(self, capper: OutputCapper, err: bytearray | None = None) -> None:
        self.capper = capper
        self.err = err
        self.buf = bytearray()
        self.need_payload = 0
        self.stream = 1

    def feed(self, chunk: bytes) -> None:
        buf = self.buf
        buf += chunk
        while buf:
            if self.need_payload:
                take = min(self.need_payload, len(buf))
                if self.err is not None and self.stream == 2:
                    self.err += buf[: min(take, max(0, _ERR_CAP - len(self.err)))]
                else:
                    self.capper.feed(bytes(buf[:take]))
                del buf[:take]
                self.need_payload -= take
                continue
            if len(buf) < 8:
                break
            self.stream = buf[0]
            self.need_payload = int.from_bytes(buf[4:8], "big")
            del buf[:8]


def pump_frames(sock: _ExecStream | socket.socket, framer: _Framer, deadline: float) -> bool:
    """Feed the exec stream into ``framer`` until EOF (True) or ``deadline`` (False)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLPRI | select.POLLHUP)
    while True:
        pending = getattr(sock, "pending", None)
        if not (pending and pending()):
            wait_ms = int((deadline - time.monotonic()) * 1000)
            if wait_ms <= 0 or not poller.poll(wait_ms):
                return False
        try:
            chunk = sock.recv(256 * 1024)
        except (BlockingIOError, InterruptedError):
            continue
        except OSError:
            return True  # the daemon closed the stream abruptly: the exec is over
        if chunk is None:  # nothing there after all (a non-blocking read)
            continue
        if not chunk:
            return True
        framer.feed(chunk)


def tar_one(name: str, data: bytes, mode: int = 0o644) -> bytes:
    """A tar archive (bytes) holding one file, for ``put_archive``."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = mode
        info.mtime = int(time.time())
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


class DockerSandbox:
    """One container for one episode. Make it with ``await DockerSandbox.create(cfg)`` (or a ``WarmPool``);
    ``close()`` removes the container. See the module docstring for the isolation it gives and does not give."""

    def __init__(self, cfg: SandboxConfig, client: Any, container_id: str, on_close: Callable[[], None] | None = None):
        self.cfg = cfg
        self.client = client
        self.id = container_id
        self._on_close = on_close
        self._closed = False
        self.uid, self.gid = 0, 0  # of the commands' user, set by `_prepare_blocking`
        self.workdir = cfg.workdir or AGENT_HOME  # default working directory of commands, set by `create`
        self._oom_seen = 0  # the memory cgroup's OOM-kill count after the last command
        self.disk_kills = 0  # times the disk watch killed the user's processes (written by its thread)
        self._disk_kills_told = 0
        self.disk_baseline: int | None = None  # writable-layer bytes when the watch first measured it
        self.disk_killed_at: int | None = 0  # the size still-growing is measured from; None: just killed
        self.disk_size: int | None = None  # writable-layer bytes at the watch's last measurement

    # ---- lifecycle -------------------------------------------------------------------------------------------
    @classmethod
    async def create(cls, cfg: SandboxConfig, labels: dict[str, str] | None = None) -> DockerSandbox:
        """Start a container from ``cfg.image`` (the offline base image when ``None``)."""
        return await run_blocking(cls.create_blocking, cfg, labels)

    @classmethod
    def create_blocking(cls, cfg: SandboxConfig, labels: dict[str, str] | None = None) -> DockerSandbox:
        """Start the container. A daemon that answered this process before and is unreachable now (restarting)
        is waited for, up to ``cfg.daemon_wait_s``; one never reached fails at once (a setup error)."""
        host, wait_s = _host_key(cfg.docker_host), cfg.daemon_wait_s
        back = poll_until(
            wait_s, 1.0, lambda e: isinstance(e, SandboxUnavailableError) and host in _ANSWERED and wait_s > 0
        )
        try:
            return back(cls._create_once, cfg, labels)
        except RetryError as gone:
            e = gone.last_attempt.exception()
            raise SandboxUnavailableError(f"{e} (waited {wait_s:g} s for it to come back)") from e

    @classmethod
    def _create_once(cls, cfg: SandboxConfig, labels: dict[str, str] | None) -> DockerSandbox:
        client = get_client(cfg.docker_host)
        _remove_pending(client, _host_key(cfg.docker_host))
        image = cfg.image or base_image_tag()
        all_labels = {
            OWNER_LABEL: "sao",
            OWNER_PID_LABEL: str(os.getpid()),
            OWNER_HOST_LABEL: socket.gethostname(),
            "sao.image": image,
            **(labels or {}),
        }
        api = client.api
        host_config = api.create_host_config(
            network_mode=cfg.network,
            mem_limit=cfg.mem_bytes,
            memswap_limit=cfg.mem_bytes,  # no swap beyond the limit
            nano_cpus=int(cfg.cpus * 1e9),
            pids_limit=cfg.pids_limit,
            cap_drop=["ALL"],
            cap_add=[*_ROOT_CAPS, *cfg.cap_add],
            security_opt=["no-new-privileges"],
            init=cfg.init,
        )
        try:
            created = api.create_container(
                image,
                command=["sleep", "infinity"],
                name=f"sao-{uuid.uuid4().hex[:12]}",
                labels=all_labels,
                host_config=host_config,
                user="0:0",  # PID 1 and its `sleep`: out of reach of the commands' unprivileged user
                working_dir=cfg.workdir,
                environment=cfg.env or None,
                stop_signal="SIGKILL",
            )
        except docker.errors.ImageNotFound as e:
            raise missing_image(image) from e
        except docker.errors.APIError as e:
            raise SandboxError(f"could not create a container from {image!r}: {e.explanation or e}") from e
        except (requests.exceptions.ConnectionError, OSError) as e:
            raise _unavailable(cfg.docker_host, e) from e
        cid = created["Id"]
        try:
            api.start(cid)
        except Exception as e:
            with contextlib.suppress(Exception):
                api.remove_container(cid, force=True)
            if isinstance(e, requests.exceptions.ConnectionError | OSError):
                raise _unavailable(cfg.docker_host, e) from e
            raise SandboxError(f"container from {image!r} did not start: {e}") from e
        sb = cls(cfg, client, cid)
        try:
            # The working directory: the configured one, else the image's WORKDIR, else the user's home.
            image_workdir = api.inspect_container(cid)["Config"].get("WorkingDir") or ""
            sb.workdir = cfg.workdir or (image_workdir if image_workdir not in ("", "/") else AGENT_HOME)
            sb._prepare_blocking()
        except BaseException as e:
            with contextlib.suppress(Exception):
                api.remove_container(cid, force=True, v=True)
            # the daemon went away between the start and the preparation (a restart): unavailable, so
            # ``create_blocking`` waits for it like any other start, instead of failing the episode at once
            if isinstance(e, requests.exceptions.ConnectionError | OSError):
                raise _unavailable(cfg.docker_host, e) from e
            raise
        _DiskWatch.of(client, _host_key(cfg.docker_host)).add(sb)
        return sb

    def _prepare_blocking(self) -> None:
        """As root, before any command: the user's numeric ids, its home, the working directory and
        ``owned_paths`` made its own."""
        workdir = "" if self.workdir == AGENT_HOME else self.workdir
        argv = ["sh", "-c", _PREPARE, "prepare", self.cfg.user, AGENT_HOME, workdir, *self.cfg.owned_paths]
        code, out = self._collect_blocking(argv, "0:0", None, timeout=600)
        ids = out.decode(errors="replace").strip().splitlines()
        if code != 0 or not ids or not re.fullmatch(r"\d+:\d+", ids[-1]):
            raise SandboxError(
                f"could not prepare container {self.id[:12]} for user {self.cfg.user!r} (exit {code}): "
                f"{out.decode(errors='replace')[-500:]}; use a 'uid:gid' or a user the image has"
            )
        uid, gid = ids[-1].split(":")
        self.uid, self.gid = int(uid), int(gid)

    async def close(self) -> None:
        """Remove the container (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            await run_blocking(self._remove_blocking)
        finally:
            if self._on_close is not None:
                self._on_close()

    def _remove_blocking(self) -> None:
        _DiskWatch.of(self.client, _host_key(self.cfg.docker_host)).discard(self)
        try:
            self.client.api.remove_container(self.id, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            if e.status_code != 409:  # 409: removal already in progress
                raise SandboxError(f"could not remove container {self.id[:12]}: {e}") from e
        except (requests.exceptions.ConnectionError, OSError):
            # The daemon is away (restarting): the next sandbox made on it removes this container.
            with _CLIENTS_LOCK:
                _PENDING_REMOVAL.setdefault(_host_key(self.cfg.docker_host), set()).add(self.id)

    async def __aenter__(self) -> DockerSandbox:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # ---- commands ----------------------------------------------------------------------------------------------
    async def exec(
        self, cmd: str, timeout: float = 60.0, workdir: str | None = None, env: dict[str, str] | None = None
    ) -> ExecResult:
        """Run ``cmd`` with the configured shell; see the module docstring for timeouts and output capping."""
        if timeout <= 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
        return await run_blocking(self.exec_blocking, cmd, timeout, workdir, env)

    def _exec_create(
        self, argv: list[str], workdir: str | None, env: dict[str, str] | None, user: str, stdin: bool = True
    ) -> str:
        try:
            ex = _while_frozen(
                lambda: self.client.api.exec_create(
                    self.id, argv, workdir=workdir, environment=env, user=user, stdin=stdin
                )
            )
            return str(ex["Id"])
        except docker.errors.NotFound as e:
            raise SandboxError(f"container {self.id[:12]} is gone: {e.explanation or e}") from e
        except docker.errors.APIError as e:
            if e.status_code == 409 and user != "0:0":
                self._check_alive()  # stopped since the last command: the agent's doing (SandboxDiedError)
            raise SandboxError(f"container {self.id[:12]} refused the command: {e.explanation or e}") from e
        except (requests.exceptions.ConnectionError, OSError) as e:
            raise _unavailable(self.cfg.docker_host, e) from e

    def _start_stream(self, exec_id: str, stdin: bytes = b"") -> _ExecStream:
        """Start the exec, open its gate and feed it ``stdin`` (see ``_ExecStream``)."""
        try:
            stream = _ExecStream(_while_frozen(lambda: self.client.api.exec_start(exec_id, socket=True)))
        except docker.errors.APIError as e:
            raise SandboxError(f"container {self.id[:12]} could not start the command: {e.explanation or e}") from e
        except (requests.exceptions.ConnectionError, OSError) as e:
            raise _unavailable(self.cfg.docker_host, e) from e
        try:
            # A command that stops reading (refused past the size limit) breaks the pipe: its output says why.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                stream.send_stdin(stdin)
        except OSError as e:
            stream.close()
            raise _unavailable(self.cfg.docker_host, e) from e
        return stream

    def _user_env(self, env: dict[str, str] | None) -> dict[str, str]:
        return {"HOME": AGENT_HOME, **self.cfg.env, **(env or {})}

    def exec_blocking(
        self, cmd: str, timeout: float, workdir: str | None = None, env: dict[str, str] | None = None
    ) -> ExecResult:
        if self._closed:
            raise SandboxError("exec on a closed sandbox")
        t0 = time.monotonic()
        blocks = str(max(1, self.cfg.disk_bytes // 512))
        argv = ["timeout", "-s", "KILL", f"{timeout:.3f}", "sh", "-c", _WRAPPER, "sh", blocks, *self.cfg.shell, cmd]
        cwd = workdir or self.workdir
        exec_id = self._exec_create(argv, cwd, self._user_env(env), self.cfg.user)
        stream = self._start_stream(exec_id)
        capper = OutputCapper(self.cfg.output_cap_bytes)
        err = bytearray()
        framer = _Framer(capper, err)
        forced = False
        try:
            done = pump_frames(stream, framer, t0 + timeout + self.cfg.kill_grace_s)
            if not done:
                # Something outlived `timeout` (it left the process group) and holds the output open.
                forced = True
                self._kill_all_blocking()
                done = pump_frames(stream, framer, time.monotonic() + self.cfg.kill_grace_s)
            if not done:
                raise SandboxError(f"command in container {self.id[:12]} could not be stopped after its timeout")
        except OSError as e:
            raise _unavailable(self.cfg.docker_host, e) from e
        finally:
            stream.close()
        exit_code = self._exit_code(exec_id)
        duration = time.monotonic() - t0
        if exit_code is None or exit_code == _KILL_EXIT:
            # A SIGKILLed command may be the first sign of the whole container dying; the daemon can report the
            # exec's death a moment before the container's, so look again briefly (not after our own timeout
            # fired: that 137 is explained).
            self._check_alive()
            for _ in range(0 if time.monotonic() - t0 >= timeout else 4):
                time.sleep(0.1)
                self._check_alive()
        if exit_code is None:
            raise SandboxError(f"the daemon lost the exit status of a command in container {self.id[:12]}")
        timed_out = forced or (exit_code == _KILL_EXIT and duration >= timeout)
        oom = re.search(rb"^oom_kill (\d+)$", bytes(err), re.MULTILINE)
        oom_killed = oom is not None and int(oom.group(1)) > self._oom_seen
        if oom is not None:
            self._oom_seen = int(oom.group(1))
        disk_full = self.disk_kills > self._disk_kills_told  # during this command, or in the background before it
        self._disk_kills_told = self.disk_kills
        return ExecResult(
            exit_code=TIMEOUT_EXIT if timed_out else exit_code,
            output=capper.text(),
            timed_out=timed_out,
            truncated=capper.truncated,
            duration_s=duration,
            oom_killed=oom_killed and not timed_out,
            disk_full=disk_full,
        )

    def _collect_blocking(
        self, argv: list[str], user: str, stdin: bytes | None, timeout: float, cap: int = 1 << 20
    ) -> tuple[int | None, bytes]:
        """Run ``argv`` as ``user`` (no wrapper), feeding it ``stdin``; its exit code and (capped) output."""
        exec_id = self._exec_create(argv, None, self._user_env(None), user)
        stream = self._start_stream(exec_id, stdin or b"")
        capper = OutputCapper(cap)
        framer = _Framer(capper)
        try:
            done = pump_frames(stream, framer, time.monotonic() + timeout)
        except OSError as e:
            raise _unavailable(self.cfg.docker_host, e) from e
        finally:
            stream.close()
        if not done:
            raise SandboxError(f"a file operation in container {self.id[:12]} did not finish in {timeout:g} s")
        return self._exit_code(exec_id), capper.data()

    async def exec_as_root(self, argv: list[str], timeout: float = 120.0, stdin: bytes = b"") -> tuple[int, str]:
        """(exit code, output capped at 1 MiB) of ``argv`` run as the container's root, for an env's own trusted
        steps (the SWE env keeps the base of its repository and takes the graded patch this way), never for a
        command the agent wrote. Root here keeps only ``CHOWN``: it reads what any user may read and writes what
        root owns, so what it writes is out of the user's reach. ``stdin`` is fed to it. ``SandboxError`` past
        ``timeout``."""
        wrapped = ["sh", "-c", _GATE + '; exec "$@"', "root", *argv]
        code, out = await run_blocking(self._collect_blocking, wrapped, "0:0", stdin, timeout)
        if code is None:
            raise SandboxError(f"the daemon lost the exit status of a root command in container {self.id[:12]}")
        return code, out.decode("utf-8", errors="replace")

    def _exit_code(self, exec_id: str) -> int | None:
        # The stream can close a few ms before the daemon records the exit status.
        for _ in range(200):
            try:
                info = self.client.api.exec_inspect(exec_id)
            except docker.errors.NotFound:
                return None
            except (requests.exceptions.ConnectionError, OSError) as e:
                raise _unavailable(self.cfg.docker_host, e) from e
            if not info.get("Running"):
                code = info.get("ExitCode")
                return None if code is None else int(code)
            time.sleep(0.01)
        return None

    def _check_alive(self) -> None:
        """``SandboxDiedError`` when the container has stopped (the daemon answers, so no infra failure: only
        the commands' user ran anything since start); ``SandboxError`` when someone removed it."""
        state = self._state()
        if state.get("Running"):
            return
        time.sleep(0.3)  # `docker rm -f` kills first: a container being removed can look merely stopped
        state = self._state()
        if state.get("Status") == "removing":
            raise SandboxError(f"container {self.id[:12]} was removed while a command ran")
        raise SandboxDiedError(
            f"the sandbox died during the agent's command (container {self.id[:12]}: "
            f"status={state.get('Status')}, exit={state.get('ExitCode')}, oom_killed={state.get('OOMKilled')})"
        )

    def _state(self) -> dict[str, Any]:
        try:
            return dict(self.client.api.inspect_container(self.id)["State"])
        except docker.errors.NotFound as e:
            raise SandboxError(f"container {self.id[:12]} was removed while a command ran") from e
        except (requests.exceptions.ConnectionError, OSError) as e:
            raise _unavailable(self.cfg.docker_host, e) from e

    def _kill_all_blocking(self) -> None:
        """Kill every process of the commands' user (PID 1 and the container stay: they are root's)."""
        with contextlib.suppress(Exception):
            # Root without CAP_KILL cannot signal another uid's processes; the user itself can signal its own.
            argv = ["kill", "-9", "-1"]
            self.client.api.exec_start(self._exec_create(argv, "/", None, self.cfg.user, stdin=False), detach=True)

    def _stop_writers_blocking(self, local: bool, frozen: bool) -> None:
        """Kill every process of the commands' user for the disk watch, as fast as it can: with the daemon on this
        machine, frozen (``docker pause``; ``frozen``: the watch already did), signalled by host pid (``docker
        top``, each pid checked to be in this container's cgroup), then thawed, so a writer does not write on
        while an exec starts; otherwise, or where this process may not signal them, ``kill -9 -1`` inside."""
        if local:
            paused = False
            if not frozen:
                with contextlib.suppress(Exception):  # refused: the watch's trip froze it already, kill all the same
                    self.client.api.pause(self.id)
                    paused = True
            try:
                killed = self._kill_user_pids_blocking()
            except Exception:
                killed = False
            finally:
                if paused:
                    with contextlib.suppress(Exception):
                        self.client.api.unpause(self.id)
            if killed:
                return
            if frozen:
                with contextlib.suppress(Exception):
                    self.client.api.unpause(self.id)  # an exec cannot enter a frozen container
        self._kill_all_blocking()

    def _kill_user_pids_blocking(self) -> bool:
        """SIGKILL, from this machine, each process of the container run by the commands' user; ``False`` when
        none could be (another pid namespace, no permission, a uid remapped by the daemon)."""
        top = self.client.api.top(self.id, ps_args="-eo pid,uid")
        titles = [t.upper() for t in top.get("Titles") or []]
        if "PID" not in titles or "UID" not in titles:
            return False
        pid_at, uid_at = titles.index("PID"), titles.index("UID")
        killed = False
        for row in top.get("Processes") or []:
            pid, uid = int(row[pid_at]), int(row[uid_at])
            if uid != self.uid or uid == 0:
                continue
            try:
                if self.id not in Path(f"/proc/{pid}/cgroup").read_text():
                    continue
                os.kill(pid, signal.SIGKILL)
                killed = True
            except (OSError, ValueError):
                continue
        return killed

    # ---- files ---------------------------------------------------------------------------------------------------
    async def read_file(self, path: str) -> str:
        """The text of ``path`` in the container. FileNotFoundError when absent (the agent's business);
        ``OSError(EFBIG)`` beyond ``read_limit_bytes`` (also the agent's business); SandboxError when the
        container is gone."""
        data = await run_blocking(self._read_bytes_blocking, path)
        return data.decode("utf-8", errors="replace")

    def _get_archive(self, path: str) -> Any:
        try:
            stream, stat = self.client.api.get_archive(self.id, path)
            return stream, stat
        except docker.errors.NotFound as e:
            if "No such container" in str(e):
                raise SandboxError(f"container {self.id[:12]} is gone") from e
            raise FileNotFoundError(f"{path} does not exist in the sandbox") from e
        except docker.errors.APIError as e:
            raise SandboxError(f"could not read {path} from container {self.id[:12]}: {e.explanation or e}") from e
        except (requests.exceptions.ConnectionError, OSError) as e:
            raise _unavailable(self.cfg.docker_host, e) from e

    def _read_bytes_blocking(self, path: str) -> bytes:
        stream, stat = self._get_archive(path)
        if stat.get("size", 0) > self.cfg.read_limit_bytes:
            raise OSError(errno.EFBIG, f"{path} is {stat['size']} bytes, over sandbox.read_limit_bytes")
        with tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024) as f:
            for chunk in stream:
                f.write(chunk)
            f.seek(0)
            with tarfile.open(fileobj=f, mode="r") as tar:
                member = tar.next()
                if member is None or not member.isfile():
                    raise IsADirectoryError(f"{path} is not a regular file in the sandbox")
                fobj = tar.extractfile(member)
                assert fobj is not None
                return fobj.read()

    async def write_file(self, path: str, content: str) -> None:
        """Write ``content`` (UTF-8) to the absolute ``path`` as the commands' user (parent directories are
        created), under the same file size limit. What the user may not do raises ``OSError`` (``PermissionError``,
        ``errno.ENOSPC`` / ``EFBIG`` past the disk limit, ...), the agent's business; ``SandboxError`` as usual."""
        if not path.startswith("/"):
            raise ValueError(f"write_file needs an absolute path inside the sandbox, got {path!r}")
        await run_blocking(self._write_blocking, path, content.encode("utf-8"))

    def _write_blocking(self, path: str, data: bytes) -> None:
        script = _GATE + '; ulimit -f "$1" || exit 126; mkdir -p -- "$(dirname -- "$2")" && cat > "$2"'
        blocks = str(max(1, self.cfg.disk_bytes // 512))
        code, out = self._collect_blocking(["sh", "-c", script, "write", blocks, path], self.cfg.user, data, 120)
        if code == 0:
            return
        if code is None:
            self._check_alive()
            raise SandboxError(f"the daemon lost the exit status of a write in container {self.id[:12]}")
        text = out.decode(errors="replace").strip()[-500:]
        if code == 128 + 25 or "File too large" in text or "space left" in text:  # 25: SIGXFSZ
            raise OSError(errno.EFBIG, f"{path}: over the sandbox's disk limit (sandbox.disk_limit): {text}")
        if "Permission denied" in text or "Read-only" in text:
            raise PermissionError(errno.EACCES, f"{path}: {text}")
        if "Is a directory" in text:
            raise IsADirectoryError(errno.EISDIR, f"{path}: {text}")
        raise OSError(errno.EIO, f"{path} could not be written (exit {code}): {text}")

    def _put_archive_blocking(self, dest_dir: str, data: Any) -> None:
        try:
            ok = self.client.api.put_archive(self.id, dest_dir, data)
        except docker.errors.NotFound as e:
            raise SandboxError(f"container {self.id[:12]} (or {dest_dir} in it) is gone: {e.explanation}") from e
        except docker.errors.APIError as e:
            raise SandboxError(f"could not write into container {self.id[:12]}: {e.explanation or e}") from e
        except (requests.exceptions.ConnectionError, OSError) as e:
            raise _unavailable(self.cfg.docker_host, e) from e
        if not ok:
            raise SandboxError(f"the daemon refused the archive for {dest_dir} in container {self.id[:12]}")

    async def copy_in(self, src: str, dest: str) -> None:
        """Copy the host file or directory ``src`` to the absolute path ``dest`` in the container."""
        if not dest.startswith("/"):
            raise ValueError(f"copy_in needs an absolute destination inside the sandbox, got {dest!r}")
        if not Path(src).exists():
            raise FileNotFoundError(f"copy_in: host path {src} does not exist")
        await run_blocking(self._copy_in_blocking, src, dest)

    def _copy_in_blocking(self, src: str, dest: str) -> None:
        # A temporary file, not memory: a repository can be large.
        with tempfile.TemporaryFile() as f:
            with tarfile.open(fileobj=f, mode="w") as tar:
                tar.add(src, arcname=dest.lstrip("/"), filter=self._owned_by_user)
            f.seek(0)
            self._put_archive_blocking("/", f)

    def _owned_by_user(self, info: tarfile.TarInfo) -> tarfile.TarInfo:
        # The daemon keeps a tar's owners: what is copied in belongs to the commands' user, who may then edit it.
        info.uid, info.gid, info.uname, info.gname = self.uid, self.gid, "", ""
        return info

    async def copy_out(self, src: str, dest: str) -> None:
        """Copy the container file or directory ``src`` to the host path ``dest`` (its parent must exist)."""
        await run_blocking(self._copy_out_blocking, src, dest)

    def _copy_out_blocking(self, src: str, dest: str) -> None:
        stream, stat = self._get_archive(src)
        target = Path(dest)
        with tempfile.TemporaryFile() as f:
            for chunk in stream:
                f.write(chunk)
            f.seek(0)
            with tarfile.open(fileobj=f, mode="r") as tar, tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                tar.extractall(tmp, filter="data")  # "data": no absolute paths, links out or device files
                Path(tmp, stat["name"]).rename(target)


class _DiskWatch:
    """One thread per daemon measuring the writable layer of this process's sandboxes (``SizeRw``, one API call
    for all) every ``disk_check_s``. Bytes written since the sandbox was ready are the episode's; past
    ``disk_limit``, and grown since the measurement that followed the last kill, every process of the commands'
    user is killed (the container and its files stay: the agent can read, delete and go on; only writing more
    is killed again). It runs while a sandbox lives, between commands too, so a writer left in the background is
    caught as well. A period starts when the previous query did, so it is ``disk_check_s`` or the daemon's size
    query, whichever is longer (the query walks the layer: ~0.1 s on a quiet host, ~2 s seen under CI's load).

    A fast writer (one into the page cache reaches ~1 GB/s here) would pass the limit by a whole period and a
    query that way, so when the daemon is on this machine a second thread samples the free space of its data
    directory every ``TRIP_S``. When the host lost more since the last query began than every sandbox may still
    write, plus ``TRIP_SLACK`` for the host's own writes, it freezes the sandboxes (``docker pause``), queries,
    stops the writers of those past their limit while they are frozen, and thaws them. The bound is then
    ``disk_limit`` plus ``TRIP_SLACK`` and what a writer manages in one ``TRIP_S``; with a remote daemon, in one
    period and its query."""

    TRIP_S = 0.05
    TRIP_SLACK = 64 << 20

    _watches: dict[str, _DiskWatch] = {}  # noqa: RUF012 - one per daemon, for the whole process
    _lock = threading.Lock()

    def __init__(self, client: Any, host: str) -> None:
        self.client = client
        self.boxes: dict[str, DockerSandbox] = {}
        self.thread: threading.Thread | None = None
        self.tripper: threading.Thread | None = None
        self.root = self._local_root(client, host)
        self.querying = threading.Lock()  # one size query and its kills at a time
        self.free_at_query: int | None = None

    @staticmethod
    def _local_root(client: Any, host: str) -> str | None:
        """The daemon's data directory when the daemon is on this machine (a local socket), else ``None``."""
        if host and not host.startswith("unix://"):
            return None
        try:
            root = client.info().get("DockerRootDir")
        except Exception:
            return None
        return root if isinstance(root, str) and os.path.isdir(root) else None

    @classmethod
    def of(cls, client: Any, host: str) -> _DiskWatch:
        with cls._lock:
            watch = cls._watches.get(host)
            if watch is None or watch.client is not client:
                watch = cls._watches[host] = cls(client, host)
            return watch

    def add(self, sb: DockerSandbox) -> None:
        # The baseline now, before any command: what the image and the start wrote are not the episode's.
        with contextlib.suppress(Exception):
            rows = self.client.api.containers(filters={"id": sb.id}, size=True)
            sb.disk_baseline = int(rows[0].get("SizeRw") or 0) if rows else None
        with self._lock:
            if not self.boxes:  # what the host lost before is no sandbox's
                self.free_at_query = self._free()
            self.boxes[sb.id] = sb
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="sao-disk-watch", daemon=True)
                self.thread.start()
            if self.root is not None and (self.tripper is None or not self.tripper.is_alive()):
                self.tripper = threading.Thread(target=self._trip_run, name="sao-disk-trip", daemon=True)
                self.tripper.start()

    def discard(self, sb: DockerSandbox) -> None:
        with self._lock:
            self.boxes.pop(sb.id, None)

    def _live(self) -> list[DockerSandbox] | None:
        """The sandboxes watched now; ``None`` (and the calling thread is to end) when there are none."""
        with self._lock:
            if not self.boxes:
                if threading.current_thread() is self.thread:
                    self.thread = None
                else:
                    self.tripper = None
                return None
            return list(self.boxes.values())

    def _run(self) -> None:
        started = 0.0
        while (boxes := self._live()) is not None:
            period = min(b.cfg.disk_check_s for b in boxes)
            time.sleep(max(0.0, period - (time.monotonic() - started)) if started else period)
            started = time.monotonic()
            self._query()

    def _query(self, frozen: bool = False) -> None:
        with self.querying:
            self.free_at_query = self._free()
            try:
                rows = self.client.api.containers(filters={"label": f"{OWNER_PID_LABEL}={os.getpid()}"}, size=True)
            except Exception:  # the daemon is away: the commands fail on their own, the watch tries again
                return
            for row in rows:
                sb = self.boxes.get(row.get("Id", ""))
                if sb is not None and self.measured(sb, int(row.get("SizeRw") or 0)):
                    sb._stop_writers_blocking(local=self.root is not None, frozen=frozen)

    def _free(self) -> int | None:
        if self.root is None:
            return None
        try:
            st = os.statvfs(self.root)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize

    def _trip_run(self) -> None:
        while (boxes := self._live()) is not None:
            time.sleep(self.TRIP_S)
            if not self.tripped(self.free_at_query, self._free(), boxes):
                continue
            frozen = []
            for sb in boxes:
                with contextlib.suppress(Exception):
                    self.client.api.pause(sb.id)
                    frozen.append(sb)
            try:
                self._query(frozen=True)
            finally:
                for sb in frozen:
                    with contextlib.suppress(Exception):
                        self.client.api.unpause(sb.id)

    @classmethod
    def tripped(cls, free_at_query: int | None, free_now: int | None, boxes: Iterable[DockerSandbox]) -> bool:
        """Whether the host lost more free disk since the last query began than the sandboxes may still write."""
        if free_at_query is None or free_now is None:
            return False
        room = 0
        for sb in boxes:
            written = 0 if sb.disk_size is None or sb.disk_baseline is None else sb.disk_size - sb.disk_baseline
            room += max(0, sb.cfg.disk_bytes - written)
        return free_at_query - free_now > room + cls.TRIP_SLACK

    @staticmethod
    def measured(sb: DockerSandbox, size: int) -> bool:
        """Record a measurement of ``sb``'s writable layer; ``True`` when its writers are to be killed."""
        sb.disk_size = size
        if sb.disk_baseline is None:
            sb.disk_baseline = size
        if sb.disk_killed_at is None:  # the first measurement after a kill: what the killed writers left
            sb.disk_killed_at = size
        elif size - sb.disk_baseline > sb.cfg.disk_bytes and size > sb.disk_killed_at:
            sb.disk_killed_at = None
            sb.disk_kills += 1
            return True
        return False


def _paused_refusal(e: BaseException) -> bool:
    """The daemon refused a call because the disk watch froze the container for a moment (a 409 "is paused")."""
    return isinstance(e, docker.errors.APIError) and e.status_code == 409 and "paused" in str(e).lower()


def _while_frozen(call: Callable[[], T], wait_s: float = 30.0) -> T:
    """``call()``, tried again every 50 ms while the daemon refuses it because the container is frozen; any other
    error, or the refusal past ``wait_s``, is raised as it came."""
    return poll_until(wait_s, 0.05, _paused_refusal, reraise=True)(call)


def _remove_pending(client: Any, host: str) -> None:
    """Remove the containers closed while ``host`` was unreachable; ``SandboxUnavailableError`` if it still is."""
    with _CLIENTS_LOCK:
        pending = _PENDING_REMOVAL.pop(host, set())
    for cid in sorted(pending):
        try:
            client.api.remove_container(cid, force=True, v=True)
        except (docker.errors.NotFound, docker.errors.APIError):
            pass
        except (requests.exceptions.ConnectionError, OSError) as e:
            with _CLIENTS_LOCK:
                _PENDING_REMOVAL.setdefault(host, set()).update(pending)
            raise _unavailable(host or None, e) from e


def remove_containers(filters: dict[str, Any], docker_host: str | None = None) -> list[str]:
    """Force-remove every container matching Docker ``filters``; returns their ids (blocking)."""
    client = get_client(docker_host)
    removed = []
    for c in client.api.containers(all=True, filters=filters):
        with contextlib.suppress(docker.errors.NotFound):
            client.api.remove_container(c["Id"], force=True, v=True)
            removed.append(c["Id"])
    return removed


def reap_orphans(docker_host: str | None = None) -> list[str]:
    """Remove sandbox containers made on this host by processes that no longer exist (after a crash).
    Containers of live processes and of other hosts sharing the daemon are left alone. Blocking."""
    client = get_client(docker_host)
    me = socket.gethostname()
    removed = []
    for c in client.api.containers(all=True, filters={"label": f"{OWNER_LABEL}=sao"}):
        labels = c.get("Labels") or {}
        if labels.get(OWNER_HOST_LABEL) != me:
            continue
        try:
            pid = int(labels.get(OWNER_PID_LABEL, ""))
        except ValueError:
            continue
        if not pid_alive(pid):
            try:
                client.api.remove_container(c["Id"], force=True, v=True)
            except docker.errors.NotFound:
                continue
            except docker.errors.APIError as e:
                if e.status_code == 409:  # another process sharing the daemon is removing it right now
                    continue
                raise
            removed.append(c["Id"])
    return removed
