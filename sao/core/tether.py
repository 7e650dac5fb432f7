"""Long-lived child processes (the vLLM servers SAO starts) that die with the process that started them, even when
that process is killed with SIGKILL and runs no cleanup.

``popen_tethered`` starts the command as the leader of a process group of its own (so that stopping it reaches its
children too: ``os.killpg(proc.pid, ...)``) plus a watcher: a small Python process outside our process tree that holds
a pidfd of the starting process and, when that process ends, sends the group SIGTERM, then SIGKILL after a grace
period. The watcher ends by itself once the group is gone.

Why a watcher and not ``prctl(PR_SET_PDEATHSIG)`` in the child: the death signal follows the *thread* that forked
the child, and a server may be started from a worker thread (a ``local:`` model's, through ``asyncio.to_thread``), so
it would die when that thread ends, not when the process does; and it reaches only the group's leader, not the engine
processes vLLM starts under it. Why a pidfd and not a pipe or polling the pid: a pidfd says when the whole
process has exited (all threads; a zombie counts as exited) and never confuses it with a later process given the same
pid, and no fork of ours can keep it open the way an inherited pipe end would. Where there is no pidfd (not Linux, or
a kernel before 5.3) the watcher polls the pid each second instead.

Not covered: a kill between the two starts (a few milliseconds), and the watcher itself being killed.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from typing import Any


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _watch(parent: int, group: int, grace_s: float) -> None:
    """The watcher (this file run as a script): end ``group`` once ``parent`` has ended, or return once the group
    is gone."""
    if os.fork() > 0:
        os._exit(0)  # leave the starter's process tree: a supervisor that kills its children (Ray) must not take this
    fd: int | None = None
    try:
        fd = os.pidfd_open(parent)
    except (AttributeError, OSError):
        pass  # no pidfd here, or the parent is already gone: poll the pid (which then says so)

    def parent_gone(wait: float) -> bool:
        if fd is not None:
            return bool(select.select([fd], [], [], wait)[0])
        time.sleep(wait)
        return not pid_alive(parent)

    while _group_alive(group):
        if parent_gone(1.0):
            for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
                try:
                    os.killpg(group, sig)
                except ProcessLookupError:
                    return
                deadline = time.monotonic() + wait
                while _group_alive(group) and time.monotonic() < deadline:
                    time.sleep(0.2)
            return


def popen_tethered(cmd: list[str], *, grace_s: float = 10.0, **popen_kw: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(cmd, start_new_session=True, **popen_kw)`` whose process group gets SIGTERM, then SIGKILL
    ``grace_s`` later, once this process ends. Stopping it cleanly stays the caller's (signal the group)."""
    proc: subprocess.Popen[bytes] = subprocess.Popen(cmd, start_new_session=True, **popen_kw)
    watcher = [sys.executable, "-I", "-S", __file__, str(os.getpid()), str(proc.pid), str(grace_s)]
    null = subprocess.DEVNULL
    try:  # the first process forks the watcher and returns at once; waiting for it leaves no zombie behind
        subprocess.run(watcher, start_new_session=True, check=True, stdin=null, stdout=null, stderr=null)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)  # an untethered server is what this module exists to prevent
        proc.wait()
        raise
    return proc


def stop_group(proc: subprocess.Popen[Any], timeout: float = 20.0) -> None:
    """Stop a group started by ``popen_tethered``: SIGTERM to the group, then SIGKILL to what is left after
    ``timeout`` (and once more after the leader ended: its children may outlive it for a moment)."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    _watch(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
