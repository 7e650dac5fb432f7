"""The SWE grader runs the policy's patch (pytest imports it) confined like the agent's sandbox: a patch that forks
a bomb or fills the disk when imported is a scored failure with a reason, the host keeps its processes and its
disk, and the grading container is gone afterwards; the gold patch still resolves under the same limits."""

from __future__ import annotations

import difflib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sao.envs.swe.grading import GradeResult, grade_patch
from sao.sandboxes.config import SandboxConfig

pytestmark = [pytest.mark.docker, pytest.mark.slow]

INIT = "toolz/__init__.py"  # imported by every toolz test: where a hostile patch puts its code
LIMITS = SandboxConfig(mem_limit="512m", cpus=1.0, pids_limit=128, disk_limit="256m", kill_grace_s=3.0)
FORK_BOMB = """
import os as _os, time as _time
while True:  # every child runs this loop too
    try:
        _os.fork()
    except OSError:
        _time.sleep(0.01)
"""
DISK_FILL = """
def _fill():  # 4 GiB in 64 MiB files: each under the one-file limit, all of them far past the disk bound
    block = b"x" * (1 << 20)
    for i in range(64):
        try:
            with open(f"/tmp/fill-{i}", "wb") as f:
                for _ in range(64):
                    f.write(block)
        except OSError:
            pass
_fill()
"""


@pytest.fixture(scope="module")
def task(offline_tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """The smallest toolz task of the shared offline fixture (toolz tests import ``toolz/__init__.py``)."""
    toolz = [t for t in offline_tasks if "toolz" in t["repo"]]
    return min(toolz, key=lambda t: len(t["FAIL_TO_PASS"]) + len(t["PASS_TO_PASS"]))


def hostile(task: dict[str, Any], docker_client: Any, code: str) -> str:
    """The task's gold patch plus ``code`` appended to ``toolz/__init__.py``: a fix whose import is hostile."""
    out = docker_client.containers.run(task["image"], ["cat", f"/testbed/{INIT}"], remove=True, network_mode="none")
    before = out.decode().splitlines(keepends=True)
    after = [*before, *code.splitlines(keepends=True)]
    diff = "".join(difflib.unified_diff(before, after, f"a/{INIT}", f"b/{INIT}"))
    assert task["patch"].endswith("\n") and diff
    return f"{task['patch']}diff --git a/{INIT} b/{INIT}\n{diff}"


class HostWatch:
    """Samples, while a grade runs, the host's process count, its free disk where Docker keeps containers, and
    whether the host can still start a process."""

    def __init__(self, docker_root: str) -> None:
        self.docker_root = docker_root
        self.procs0, self.free0 = self.procs(), shutil.disk_usage(docker_root).free
        self.max_procs, self.min_free, self.spawn_failures, self.spawns = self.procs0, self.free0, 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    @staticmethod
    def procs() -> int:
        return sum(1 for p in os.listdir("/proc") if p.isdigit())

    def run(self) -> None:
        while not self.stop.wait(0.05):
            self.max_procs = max(self.max_procs, self.procs())
            self.min_free = min(self.min_free, shutil.disk_usage(self.docker_root).free)
            self.spawns += 1
            try:
                subprocess.run(["true"], check=True, timeout=10)
            except (OSError, subprocess.SubprocessError):
                self.spawn_failures += 1


@pytest.fixture
def watched(docker_client: Any) -> Iterator[Callable[[Callable[[], GradeResult]], tuple[GradeResult, HostWatch]]]:
    def run(grade: Callable[[], GradeResult]) -> tuple[GradeResult, HostWatch]:
        watch = HostWatch(docker_client.info()["DockerRootDir"])
        watch.thread.start()
        try:
            return grade(), watch
        finally:
            watch.stop.set()
            watch.thread.join()

    yield run
    # every grading container of this process is gone once its grade is returned
    left = docker_client.containers.list(all=True, filters={"label": f"sao.owner_pid={os.getpid()}"})
    assert not left, [c.name for c in left]


def test_a_fork_bomb_on_import_is_a_scored_timeout_and_the_host_keeps_its_processes(
    task: dict[str, Any], docker_client: Any, watched: Any
) -> None:
    patch = hostile(task, docker_client, FORK_BOMB)
    t0 = time.monotonic()
    graded, host = watched(lambda: grade_patch(task, patch, timeout=15, sandbox=LIMITS))
    assert not graded.resolved and graded.applied
    assert graded.extra["failure"] == "timeout" and "15 s" in graded.extra["reason"], graded.extra
    assert "Timeout error: 15 seconds exceeded." in graded.log
    # unconfined, the bomb reached thousands of processes; here the pids limit holds it (plus the host's own churn)
    assert host.max_procs - host.procs0 < LIMITS.pids_limit + 400, (host.procs0, host.max_procs)
    assert host.spawns > 0 and host.spawn_failures == 0
    assert time.monotonic() - t0 < 50
    subprocess.run(["true"], check=True, timeout=10)


def test_a_disk_fill_on_import_is_a_scored_failure_and_the_host_keeps_its_disk(
    task: dict[str, Any], docker_client: Any, watched: Any
) -> None:
    patch = hostile(task, docker_client, DISK_FILL)
    graded, host = watched(lambda: grade_patch(task, patch, timeout=120, sandbox=LIMITS))
    assert not graded.resolved and graded.applied
    assert graded.extra["failure"] == "disk_full" and "disk_limit" in graded.extra["reason"], graded.extra
    # the patch tried 4 GiB; the bound is disk_limit, the watch's trip slack and what the patch writes before the
    # watch, seeing the host's free disk drop past the sandbox's room, freezes it (~0.4 GiB in all here; before
    # the freeze, a size query and an exec's kill let it write 0.6-1.4 GiB)
    drop = host.free0 - host.min_free
    print(f"the host's free disk dropped by at most {drop >> 20} MiB (disk_limit {LIMITS.disk_bytes >> 20} MiB)")
    assert drop < LIMITS.disk_bytes + (1 << 30), f"the host's free disk dropped by {drop >> 20} MiB"
    assert host.spawn_failures == 0


def test_the_gold_patch_still_resolves_as_the_unprivileged_user(task: dict[str, Any], watched: Any) -> None:
    """Under the same limits, the eval script (told to say who runs it) runs as uid 1000 and resolves the task."""
    script = task["eval_script"].replace("\ncd /testbed\n", "\ncd /testbed\nid -u\n", 1)
    assert script != task["eval_script"]
    told = {**task, "eval_script": script}
    graded, _ = watched(lambda: grade_patch(told, task["patch"], timeout=120, sandbox=LIMITS))
    assert graded.resolved and graded.extra == {}, graded.log[-3000:]
    assert "+ id -u\n1000\n" in graded.log, graded.log[:2000]
