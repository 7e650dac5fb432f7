"""Whether the host's process table holds the sandboxes a run may keep at once: ``pid_max`` against their pids limits.

A container's ``pids_limit`` bounds what a fork bomb in it takes, but the bound is per container: N sandboxes of
limit L can hold N x L processes of the host's ``/proc/sys/kernel/pid_max`` (32,768 on many kernels), and when the
table is full no process on the host can start, the trainer's included. So a run checks up front that its most
sandboxes at once, each full, still leave the host a margin; only for a local Docker daemon (a remote one has its
own table, which this host cannot see)."""

from __future__ import annotations

import os
from pathlib import Path

PID_MAX_PATH = Path("/proc/sys/kernel/pid_max")
LOADAVG_PATH = Path("/proc/loadavg")
# What the host keeps for itself beyond the processes running now: its engines, trainers and tools starting later.
HOST_MARGIN = 4096


def pid_headroom_error(slots: int, pids_per_slot: int, pid_max: int, running: int, what: str) -> str | None:
    """Why ``slots`` sandbox sets of ``pids_per_slot`` pids each do not fit next to ``running`` processes and
    ``HOST_MARGIN`` under ``pid_max``; ``None`` when they do. ``what`` names the setting that sets ``slots``."""
    need = slots * pids_per_slot
    room = pid_max - running - HOST_MARGIN
    if need <= room:
        return None
    fit = max(0, room // max(1, pids_per_slot))
    return (
        f"{what}={slots} episodes at once, each with sandboxes allowed {pids_per_slot} processes, can hold {need} "
        f"processes, but the host's kernel.pid_max is {pid_max} with {running} running and {HOST_MARGIN} kept for "
        f"the host: a fork bomb in every sandbox would leave the host unable to start a process. Lower {what} "
        f"(at most {fit} fit), lower sandbox.pids_limit, or raise the host's limit (sysctl -w kernel.pid_max=4194304)"
    )


def _local_daemon(docker_host: str | None) -> bool:
    host = docker_host or os.environ.get("DOCKER_HOST") or ""
    return host == "" or host.startswith("unix://")


def check_pid_headroom(slots: int, pids_per_slot: int, what: str, docker_host: str | None = None) -> None:
    """``ValueError`` (see ``pid_headroom_error``) when this host's process table cannot hold the sandboxes of
    ``slots`` episodes at once; nothing for a remote Docker daemon or a host without ``/proc``."""
    if pids_per_slot <= 0 or not _local_daemon(docker_host):
        return
    try:
        pid_max = int(PID_MAX_PATH.read_text().strip())
        running = int(LOADAVG_PATH.read_text().split()[3].split("/")[1])  # tasks, threads included: each takes a pid
    except (OSError, ValueError, IndexError):
        return
    error = pid_headroom_error(slots, pids_per_slot, pid_max, running, what)
    if error:
        raise ValueError(error)
