"""DockerSandbox against a real daemon: commands, files, limits, and the faults it must survive."""

from __future__ import annotations

import asyncio
import os
import resource
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from sao.sandboxes.config import SandboxConfig
from sao.sandboxes.docker import DockerSandbox, reap_orphans
from sao.sandboxes.protocols import (
    ExecResult,
    ImageNotFoundError,
    SandboxDiedError,
    SandboxError,
    SandboxUnavailableError,
)
from tests.conftest import free_port

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leftovers"), pytest.mark.timeout(120)]


async def test_exec_basics_limits_and_labels(docker_cfg: SandboxConfig, docker_client: Any) -> None:
    async with await DockerSandbox.create(docker_cfg) as sb:
        r = await sb.exec("echo out; echo err >&2; exit 3", timeout=10)
        assert (r.exit_code, r.output, r.timed_out, r.truncated) == (3, "out\nerr\n", False, False)
        r = await sb.exec("pwd; echo $FOO", timeout=10, workdir="/tmp", env={"FOO": "bar"})
        assert r.output == "/tmp\nbar\n"
        r = await sb.exec("pwd", timeout=10, workdir="/missing")
        assert r.exit_code == 126 and "/missing" in r.output  # the command's failure, not the sandbox's
        r = await sb.exec("grep CapEff /proc/self/status; grep NoNewPrivs /proc/self/status", timeout=10)
        assert "CapEff:\t0000000000000000" in r.output and "NoNewPrivs:\t1" in r.output
        # Root without capabilities cannot mount (the usual first step of escaping to the host).
        r = await sb.exec("mount -t tmpfs none /mnt", timeout=10)
        assert r.exit_code != 0
        info = docker_client.api.inspect_container(sb.id)
        hc = info["HostConfig"]
        assert (hc["NetworkMode"], hc["Memory"], hc["PidsLimit"], hc["NanoCpus"]) == ("none", 256 << 20, 64, 10**9)
        assert info["Config"]["Labels"]["sao.owner_pid"] == str(os.getpid())
        assert info["Config"]["Labels"]["sao.owner"] == "sao"
        cid = sb.id
    assert not docker_client.api.containers(all=True, filters={"id": cid})


async def test_network_attempt_fails(docker_cfg: SandboxConfig) -> None:
    async with await DockerSandbox.create(docker_cfg) as sb:
        r = await sb.exec(
            "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), timeout=3)'", timeout=20
        )
        assert r.exit_code != 0 and "Network is unreachable" in r.output
        r = await sb.exec("ls /sys/class/net", timeout=10)
        assert r.output.split() == ["lo"]


async def test_timeout_kills_command_not_container(docker_cfg: SandboxConfig) -> None:
    async with await DockerSandbox.create(docker_cfg) as sb:
        t0 = time.monotonic()
        r = await sb.exec("echo started; sleep 60; echo never", timeout=1.5)
        assert r.timed_out and r.exit_code == 124 and r.output == "started\n"
        assert 1.5 <= r.duration_s < 10 and time.monotonic() - t0 < 10
        # The whole process group died: no `sleep 60` is left, and the container still answers.
        r = await sb.exec("ps -eo comm | grep -c '^sleep$' || true", timeout=10)
        assert r.output.strip() == "1"  # the container's own `sleep infinity`
        assert (await sb.exec("echo alive", timeout=10)).output == "alive\n"


@pytest.mark.timeout(400)  # ~5 s on an idle 2-core machine; minutes when the daemon shares the cores
async def test_one_gigabyte_of_output_is_capped(docker_cfg: SandboxConfig) -> None:
    cfg = SandboxConfig(**{**docker_cfg.__dict__, "output_cap_bytes": 4096})
    async with await DockerSandbox.create(cfg) as sb:
        rss_before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        r = await sb.exec("echo START; head -c 1G /dev/zero | tr '\\0' a; echo; echo END", timeout=300)
        grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before_kib) / 1024
    assert r.exit_code == 0 and r.truncated and not r.timed_out
    assert r.output.startswith("START\naaaa") and r.output.endswith("aaaa\nEND\n")
    assert "bytes truncated ...]" in r.output and len(r.output) < 4096 + 100
    dropped = int(r.output.split("[... ")[1].split(" bytes")[0])
    assert dropped == len("START\n") + (1 << 30) + len("\nEND\n") - 4096
    assert grown_mib < 100, f"host RSS peak grew by {grown_mib:.0f} MiB while streaming 1 GiB"


async def test_fork_bomb_is_contained(docker_cfg: SandboxConfig) -> None:
    async with await DockerSandbox.create(docker_cfg) as sb:
        r = await sb.exec("bomb() { bomb | bomb & }; bomb; sleep 5", timeout=4)
        assert isinstance(r, ExecResult) and (r.timed_out or r.exit_code != 0)
        # The pids limit held, the timeout killed the tree, the init reaped it: the container works again.
        for _ in range(50):
            alive = await sb.exec("echo alive", timeout=10)
            if alive.exit_code == 0:
                break
            await asyncio.sleep(0.2)
        assert alive.output == "alive\n"


async def test_allocation_above_memory_limit_is_killed(docker_cfg: SandboxConfig) -> None:
    async with await DockerSandbox.create(docker_cfg) as sb:
        r = await sb.exec("python3 -c 'b = bytearray(1 << 30); print(len(b))'", timeout=60)
        assert r.exit_code == 137 and not r.timed_out
        assert (await sb.exec("echo alive", timeout=10)).output == "alive\n"


async def test_writes_never_reach_the_host(docker_cfg: SandboxConfig, tmp_path: Path) -> None:
    target = tmp_path / "host_file"
    target.write_text("host")
    async with await DockerSandbox.create(docker_cfg) as sb:
        r = await sb.exec(f"mkdir -p {tmp_path} && echo pwned > {target} && cat {target}", timeout=10)
        assert r.output == "pwned\n"  # it wrote to its own filesystem...
        r = await sb.exec("cat /proc/self/mountinfo", timeout=10)
        assert str(tmp_path) not in r.output
    assert target.read_text() == "host"  # ...never to the host's


async def test_container_dying_mid_exec_is_the_commands_failure(docker_cfg: SandboxConfig, docker_client: Any) -> None:
    """The daemon answers and the container stopped during the agent's command: ``SandboxDiedError`` (scored),
    then and on the next command; a container removed under a command is an infra ``SandboxError``."""
    sb = await DockerSandbox.create(docker_cfg)
    try:
        task = asyncio.create_task(sb.exec("sleep 30", timeout=60))
        await asyncio.sleep(1.0)
        await asyncio.to_thread(docker_client.api.kill, sb.id)
        with pytest.raises(SandboxDiedError, match="the sandbox died during the agent's command"):
            await asyncio.wait_for(task, 20)
        with pytest.raises(SandboxDiedError):
            await sb.exec("echo hi", timeout=5)
    finally:
        await sb.close()
    sb = await DockerSandbox.create(docker_cfg)
    try:
        task = asyncio.create_task(sb.exec("sleep 30", timeout=60))
        await asyncio.sleep(1.0)
        await asyncio.to_thread(docker_client.api.remove_container, sb.id, force=True)
        with pytest.raises(SandboxError, match=r"removed|gone"):
            await asyncio.wait_for(task, 20)
    finally:
        await sb.close()


async def test_unreachable_daemon_raises_unavailable(
    docker_cfg: SandboxConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"tcp://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(SandboxUnavailableError, match="cannot be reached"):
        await DockerSandbox.create(SandboxConfig(**{**docker_cfg.__dict__, "docker_host": url}))
    monkeypatch.setenv("DOCKER_HOST", url)  # the environment variable is honoured the same way
    with pytest.raises(SandboxUnavailableError, match=url):
        await DockerSandbox.create(docker_cfg)
    assert time.monotonic() - t0 < 20


async def test_missing_image_is_image_not_found(docker_cfg: SandboxConfig) -> None:
    cfg = SandboxConfig(**{**docker_cfg.__dict__, "image": "sao-no-such-image:0"})
    with pytest.raises(ImageNotFoundError, match="sao-no-such-image:0"):
        await DockerSandbox.create(cfg)


async def test_files_roundtrip(docker_cfg: SandboxConfig, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    (src / "run.sh").write_text("echo run\n")
    async with await DockerSandbox.create(SandboxConfig(**{**docker_cfg.__dict__, "read_limit_bytes": 1000})) as sb:
        await sb.write_file("/tmp/deep/new/dir/ünï.txt", "héllo\n")
        assert await sb.read_file("/tmp/deep/new/dir/ünï.txt") == "héllo\n"
        assert (await sb.exec("cat /tmp/deep/new/dir/ünï.txt", timeout=10)).output == "héllo\n"
        # Written as the commands' user: it may edit the file, and may not write where that user may not.
        assert (
            await sb.exec("echo more >> /tmp/deep/new/dir/ünï.txt && stat -c %u /tmp/deep", timeout=10)
        ).output == "1000\n"
        with pytest.raises(PermissionError):
            await sb.write_file("/etc/evil", "x")
        with pytest.raises(FileNotFoundError):
            await sb.read_file("/no/such/file")
        await sb.exec("head -c 5000 /dev/zero > /tmp/big", timeout=10)
        with pytest.raises(OSError, match="read_limit_bytes"):
            await sb.read_file("/tmp/big")
        await sb.copy_in(str(src), "/repo")
        assert (await sb.exec("cat /repo/pkg/mod.py && sh /repo/run.sh", timeout=10)).output == "X = 1\nrun\n"
        await sb.exec("echo changed > /repo/pkg/mod.py", timeout=10)
        await sb.copy_out("/repo", str(tmp_path / "back"))
        await sb.copy_out("/repo/run.sh", str(tmp_path / "run_back.sh"))
    assert (tmp_path / "back" / "pkg" / "mod.py").read_text() == "changed\n"
    assert (tmp_path / "run_back.sh").read_text() == "echo run\n"


def test_reaper_removes_only_containers_of_dead_owners(docker_client: Any, base_image: str) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    made = []
    for pid in (dead.pid, os.getpid()):
        c = docker_client.api.create_container(
            base_image,
            command=["sleep", "infinity"],
            labels={"sao.owner": "sao", "sao.owner_pid": str(pid), "sao.owner_host": os.uname().nodename},
        )
        made.append(c["Id"])
    try:
        removed = reap_orphans()
        assert made[0] in removed and made[1] not in removed
        assert docker_client.api.containers(all=True, filters={"id": made[1]})
    finally:
        for cid in made:
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True)


async def test_non_root_user_when_configured(docker_cfg: SandboxConfig) -> None:
    async with await DockerSandbox.create(SandboxConfig(**{**docker_cfg.__dict__, "user": "nobody"})) as sb:
        assert (await sb.exec("id -u", timeout=10)).output == "65534\n"
        r = await sb.exec("touch /etc/x", timeout=10)
        assert r.exit_code != 0 and "Permission denied" in r.output
        assert (await sb.exec("sleep 30", timeout=1)).timed_out


async def test_commands_cannot_stop_their_sandbox(docker_cfg: SandboxConfig, docker_client: Any) -> None:
    async with await DockerSandbox.create(docker_cfg) as sb:
        r = await sb.exec("id -u; grep CapEff /proc/self/status; kill -9 1; kill -9 -1; echo survived", timeout=20)
        assert r.output.startswith("1000\nCapEff:\t0000000000000000\n") and "survived" in r.output
        assert "Operation not permitted" in r.output  # PID 1 is root's
        assert docker_client.api.inspect_container(sb.id)["State"]["Running"]
        r = await sb.exec("ps -o user= -p 1; pgrep -u root -x sleep >/dev/null && echo root-sleep", timeout=10)
        assert r.output.split() == ["root", "root-sleep"]
        assert (await sb.exec("echo alive", timeout=10)).output == "alive\n"


def _written(docker_client: Any, cid: str) -> int:
    return int(docker_client.api.containers(all=True, filters={"id": cid}, size=True)[0]["SizeRw"])


async def test_disk_limit_refuses_big_files_and_kills_writers_past_it(
    docker_cfg: SandboxConfig, docker_client: Any
) -> None:
    limit = 64 << 20
    cfg = SandboxConfig(**{**docker_cfg.__dict__, "disk_limit": limit, "disk_check_s": 0.5})
    async with await DockerSandbox.create(cfg) as sb:
        r = await sb.exec("head -c 1G /dev/zero > /tmp/one; stat -c %s /tmp/one", timeout=60)
        assert "File size limit exceeded" in r.output and r.output.split()[-1] == str(limit)
        assert not r.disk_full  # refused by the kernel at once: nothing to kill
        await sb.exec("rm /tmp/one", timeout=10)
        # Many files under the size limit: the watch on the writable layer kills the writer. Unwatched, each loop
        # below writes 4.8 GB; the bound is the limit plus what a writer manages in one watch period, which is the
        # daemon's size query when that is slower than disk_check_s (under CI's load ~2 s: 274 and 622 MB seen).
        # The bound checked is 1 GiB: four times the limit, a fifth of what an unwatched writer writes.
        bound = limit + (1 << 30)
        r = await sb.exec("for i in $(seq 600); do head -c 8M /dev/zero > /tmp/f$i; done; echo finished", timeout=60)
        assert r.disk_full and r.exit_code == 137 and "finished" not in r.output, r
        assert _written(docker_client, sb.id) < bound
        r = await sb.exec("ls /tmp | wc -l; rm -f /tmp/f*; echo cleaned", timeout=20)  # reading and deleting go on
        assert "cleaned" in r.output and not r.disk_full
        # A writer left in the background is caught between commands; the next command is told.
        await sb.exec("(for i in $(seq 600); do head -c 8M /dev/zero > /tmp/g$i; done) >/dev/null 2>&1 &", timeout=10)
        await asyncio.sleep(8)
        r = await sb.exec("pgrep -c head || true; ls /tmp | grep -c '^g' || true", timeout=10)
        assert r.disk_full and r.output.split()[0] == "0", r
        assert int(r.output.split()[1]) < 600 and _written(docker_client, sb.id) < bound, r


async def test_a_command_started_while_the_disk_watch_froze_the_sandbox_runs_once_it_thaws(
    docker_cfg: SandboxConfig, docker_client: Any
) -> None:
    """The disk watch pauses sandboxes for a moment when the host's disk drops fast; the daemon refuses an exec
    into a paused container (409), so a command that starts then waits for the thaw instead of failing."""
    async with await DockerSandbox.create(docker_cfg) as sb:
        docker_client.api.pause(sb.id)
        thaw = asyncio.get_running_loop().call_later(1.0, docker_client.api.unpause, sb.id)
        t0 = time.monotonic()
        try:
            r = await sb.exec("echo thawed", timeout=10)
        finally:
            thaw.cancel()
        assert (r.exit_code, r.output) == (0, "thawed\n") and time.monotonic() - t0 >= 1.0


async def test_memory_kills_are_told_apart_from_other_kills(docker_cfg: SandboxConfig) -> None:
    async with await DockerSandbox.create(docker_cfg) as sb:
        r = await sb.exec("python3 -c 'b = bytearray(1 << 30)'", timeout=60)
        assert r.exit_code == 137 and r.oom_killed and not r.timed_out
        r = await sb.exec("kill -9 $$", timeout=10)
        assert r.exit_code == 137 and not r.oom_killed
        r = await sb.exec("sleep 5", timeout=1)
        assert r.timed_out and not r.oom_killed


async def test_quick_commands_never_lose_their_output(docker_cfg: SandboxConfig) -> None:
    """Output that reached the client with the exec's upgrade response was buffered out of reach (seen under load:
    "exit 0" with nothing printed); every exec now waits for its gate line before it runs, so none can be."""
    async with await DockerSandbox.create(docker_cfg) as sb:
        sem = asyncio.Semaphore(8)

        async def one(i: int) -> ExecResult:
            async with sem:
                return await sb.exec(f"echo {i}; cat", timeout=30)  # `cat`: stdin is closed after the gate

        results = await asyncio.gather(*(one(i) for i in range(64)))
        await sb.write_file("/tmp/data", "line\n" * 3)
        assert await sb.read_file("/tmp/data") == "line\n" * 3  # stdin after the gate reaches the command whole
    assert [(r.exit_code, r.output) for r in results] == [(0, f"{i}\n") for i in range(64)]


async def test_owned_paths_become_the_users_at_start(docker_cfg: SandboxConfig) -> None:
    """``owned_paths`` (the SWE grader's conda env of official images) are made the commands' user's, like the
    working directory; a path the image lacks is skipped."""
    cfg = SandboxConfig(**{**docker_cfg.__dict__, "owned_paths": ("/usr/local/lib", "/not/in/this/image")})
    async with await DockerSandbox.create(cfg) as sb:
        r = await sb.exec("touch /usr/local/lib/x && stat -c %u /usr/local/lib/x; ls /not 2>&1", timeout=10)
        assert r.output.startswith("1000\n") and "No such file" in r.output, r.output
    async with await DockerSandbox.create(docker_cfg) as sb:
        assert (await sb.exec("touch /usr/local/lib/x", timeout=10)).exit_code != 0
