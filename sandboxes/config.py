"""Typed sandbox configuration (`sandbox:` in the config tree): backend, image, limits, pool sizes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

Backend = Literal["docker", "bwrap"]
_MEM_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_USER_RE = re.compile(r"^(?:\d+:\d+|[a-z_][a-z0-9_-]*)$")
_MEM_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_bytes(value: int | str, name: str = "value") -> int:
    """``"512m"`` / ``"1g"`` / ``"2GiB"`` / ``1048576`` -> bytes; a ValueError naming ``name`` otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{name}: expected a size such as '512m' or a number of bytes, got {value!r}")
    if isinstance(value, int):
        n = value
    else:
        m = _MEM_RE.match(str(value))
        if not m:
            raise ValueError(f"{name}: cannot read {value!r} as a size; write e.g. '512m', '2g' or a byte count")
        n = int(float(m.group(1)) * _MEM_UNITS[m.group(2).lower()])
    if n <= 0:
        raise ValueError(f"{name}: must be positive, got {value!r}")
    return n


@dataclass
class SandboxConfig:
    """How to make one sandbox. Every field is validated in ``__post_init__`` with a message naming it.

    Fields:
        backend: ``"docker"`` (default; one container per episode) or ``"bwrap"`` (hosts without Docker).
        image: Docker image tag the container runs (docker only); ``None`` means the offline base image.
        mem_limit: memory cap, e.g. ``"1g"`` (docker: cgroup memory+swap; bwrap: RLIMIT_AS of the command).
        cpus: CPU share in cores (docker only; bwrap cannot limit CPU without cgroups).
        pids_limit: max processes in the container (docker only), what stops a fork bomb.
        network: ``"none"`` (default: loopback only) or a Docker network name such as ``"bridge"``;
            bwrap accepts ``"none"`` or ``"host"``.
        output_cap_bytes: max bytes of one command's output kept; beyond it the head and tail halves are kept
            around a ``[... N bytes truncated ...]`` marker and ``ExecResult.truncated`` is set.
        read_limit_bytes: largest file ``read_file`` returns (``OSError(EFBIG)`` beyond it).
        user: the unprivileged user every command runs as, ``"uid:gid"`` (default ``"1000:1000"``; docker also
            takes a user name of the image, e.g. ``"nobody"``). It cannot signal PID 1 or the sandbox's own
            processes, which run as root; root is refused here (an agent running as root could stop its
            sandbox and so end its own episode as an infra error). bwrap maps it in its user namespace.
        workdir: default working directory of commands (docker: the image's ``WORKDIR`` when ``None``, or the
            user's home ``/home/sao`` when that is ``/``; made the user's at start; bwrap: always ``/work``).
        owned_paths: more absolute paths made the user's at start, like ``workdir`` (docker only; ``chown -R``
            when root's; each only when the image has it), e.g. an environment the commands install into. Their
            copy-up is counted in the disk baseline, not in the episode's ``disk_limit``.
        disk_limit: most bytes an episode may write (e.g. ``"1g"``). Every command runs under ``ulimit -f`` of
            this size (a bigger file is refused by the kernel: ``File too large``); docker also watches the
            container's writable layer and bwrap its ``/work`` (polled every ``disk_check_s``) and kills the
            user's processes when the total passes the limit; bwrap's ``/tmp`` is a tmpfs of this size.
        disk_check_s: seconds between two measurements of the sandbox's written bytes.
        shell: the argv prefix that runs a command string.
        env: extra environment variables for every command.
        cap_add: Linux capabilities given back after ``cap_drop=ALL`` (docker); empty by default.
        init: run a reaping init as PID 1 (docker ``--init``) so killed process trees leave no zombies that
            would eat the pids limit.
        docker_host: Docker daemon URL (``None``: ``DOCKER_HOST`` or the local socket).
        kill_grace_s: seconds past a timeout before the sandbox forcibly kills every process it holds.
        daemon_wait_s: how long creating a docker sandbox waits for a daemon that answered before and is
            unreachable now (restarting); 0 fails at once. A daemon never reached always fails at once.
        bwrap_ro_binds: extra host paths visible read-only inside a bwrap sandbox (e.g. a venv).
    """

    backend: Backend = "docker"
    image: str | None = None
    mem_limit: int | str = "1g"
    cpus: float = 1.0
    pids_limit: int = 256
    network: str = "none"
    output_cap_bytes: int = 64 * 1024
    read_limit_bytes: int = 16 * 1024 * 1024
    user: str = "1000:1000"
    workdir: str | None = None
    shell: tuple[str, ...] = ("bash", "-c")
    env: dict[str, str] = field(default_factory=dict)
    cap_add: tuple[str, ...] = ()
    init: bool = True
    docker_host: str | None = None
    kill_grace_s: float = 5.0
    daemon_wait_s: float = 300.0
    bwrap_ro_binds: tuple[str, ...] = ()
    disk_limit: int | str = "1g"
    disk_check_s: float = 1.0
    owned_paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.backend not in ("docker", "bwrap"):
            raise ValueError(f"sandbox.backend: must be 'docker' or 'bwrap', got {self.backend!r}")
        self.mem_limit = parse_bytes(self.mem_limit, "sandbox.mem_limit")
        if not isinstance(self.cpus, int | float) or self.cpus <= 0:
            raise ValueError(f"sandbox.cpus: must be a positive number of cores, got {self.cpus!r}")
        if not isinstance(self.pids_limit, int) or self.pids_limit < 8:
            raise ValueError(
                f"sandbox.pids_limit: must be an integer >= 8 (a shell needs a few), got {self.pids_limit!r}"
            )
        if not self.network or not isinstance(self.network, str):
            raise ValueError(f"sandbox.network: must be 'none' or a Docker network name, got {self.network!r}")
        if self.backend == "bwrap" and self.network not in ("none", "host"):
            raise ValueError(f"sandbox.network: bwrap supports only 'none' or 'host', got {self.network!r}")
        if not isinstance(self.output_cap_bytes, int) or self.output_cap_bytes < 64:
            raise ValueError(f"sandbox.output_cap_bytes: must be an integer >= 64, got {self.output_cap_bytes!r}")
        self.read_limit_bytes = parse_bytes(self.read_limit_bytes, "sandbox.read_limit_bytes")
        self.shell = tuple(self.shell)
        if not self.shell or not all(isinstance(s, str) and s for s in self.shell):
            raise ValueError(f"sandbox.shell: must be a non-empty argv such as ['bash', '-c'], got {self.shell!r}")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()):
            raise ValueError("sandbox.env: keys and values must be strings")
        self.cap_add = tuple(self.cap_add)
        if self.kill_grace_s <= 0:
            raise ValueError(f"sandbox.kill_grace_s: must be positive, got {self.kill_grace_s!r}")
        if not isinstance(self.daemon_wait_s, int | float) or self.daemon_wait_s < 0:
            raise ValueError(f"sandbox.daemon_wait_s: must be seconds >= 0, got {self.daemon_wait_s!r}")
        self.bwrap_ro_binds = tuple(self.bwrap_ro_binds)
        if not isinstance(self.user, str) or not _USER_RE.match(self.user):
            raise ValueError(
                f"sandbox.user: must be 'uid:gid' (e.g. '1000:1000') or a user name of the image, got {self.user!r}"
            )
        if self.user.split(":")[0] in ("0", "root"):
            raise ValueError(
                "sandbox.user: commands may not run as root (they could stop their own sandbox); use an "
                "unprivileged user such as '1000:1000'"
            )
        if self.backend == "bwrap" and not re.match(r"^\d+:\d+$", self.user):
            raise ValueError(f"sandbox.user: bwrap maps a numeric 'uid:gid' (e.g. '1000:1000'), got {self.user!r}")
        self.disk_limit = parse_bytes(self.disk_limit, "sandbox.disk_limit")
        if self.disk_limit < 1 << 20:
            raise ValueError(f"sandbox.disk_limit: must be at least 1 MiB ('1m'), got {self.disk_limit!r} bytes")
        if not isinstance(self.disk_check_s, int | float) or not 0 < self.disk_check_s <= 60:
            raise ValueError(f"sandbox.disk_check_s: must be seconds in (0, 60], got {self.disk_check_s!r}")
        self.owned_paths = tuple(self.owned_paths)
        if not all(isinstance(p, str) and p.startswith("/") and p != "/" for p in self.owned_paths):
            raise ValueError(
                f"sandbox.owned_paths: must be absolute paths inside the sandbox (not '/'), got {self.owned_paths!r}"
            )
        if self.workdir is not None and not self.workdir.startswith("/"):
            raise ValueError(f"sandbox.workdir: must be an absolute path inside the sandbox, got {self.workdir!r}")

    @property
    def mem_bytes(self) -> int:
        """``mem_limit`` in bytes (normalised in ``__post_init__``)."""
        return int(self.mem_limit)

    @property
    def disk_bytes(self) -> int:
        """``disk_limit`` in bytes (normalised in ``__post_init__``)."""
        return int(self.disk_limit)


@dataclass
class PoolConfig:
    """Sizes of a warm pool (one per image).

    Fields:
        size: containers kept started and idle, ready for ``acquire()``.
        max_concurrency: most sandboxes leased at once from this pool; ``acquire()`` waits beyond it.
        per_host_limit: most containers (idle + leased + starting) this process keeps on one Docker host
            across all pools; ``None`` means no limit beyond ``size + max_concurrency``.
        start_parallelism: containers started at the same time while refilling.
    """

    size: int = 4
    max_concurrency: int = 32
    per_host_limit: int | None = None
    start_parallelism: int = 4

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or self.size < 0:
            raise ValueError(f"pool.size: must be an integer >= 0, got {self.size!r}")
        if not isinstance(self.max_concurrency, int) or self.max_concurrency < 1:
            raise ValueError(f"pool.max_concurrency: must be an integer >= 1, got {self.max_concurrency!r}")
        if self.per_host_limit is not None and (not isinstance(self.per_host_limit, int) or self.per_host_limit < 1):
            raise ValueError(f"pool.per_host_limit: must be an integer >= 1 or null, got {self.per_host_limit!r}")
        if not isinstance(self.start_parallelism, int) or self.start_parallelism < 1:
            raise ValueError(f"pool.start_parallelism: must be an integer >= 1, got {self.start_parallelism!r}")
