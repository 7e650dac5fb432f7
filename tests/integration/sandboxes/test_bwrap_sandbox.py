"""BwrapSandbox on this host: read-only root, writable /work, no network, timeouts, capped output."""

from __future__ import annotations

import resource
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sao.sandboxes.bwrap import BwrapSandbox
from sao.sandboxes.config import SandboxConfig
from sao.sandboxes.protocols import SandboxError, SandboxUnavailableError
from tests._require import missing

pytestmark = pytest.mark.timeout(120)


@pytest.fixture()
async def sb() -> AsyncIterator[BwrapSandbox]:
    if shutil.which("bwrap") is None:
        missing("bubblewrap", "run `apt-get install bubblewrap`")
    probe = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--unshare-all", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        missing("a working bubblewrap", f"bwrap cannot create namespaces here: {probe.stderr.strip()}")
    box = BwrapSandbox(SandboxConfig(backend="bwrap", mem_limit="256m", output_cap_bytes=4096))
    yield box
    await box.close()
    assert not box.host_workdir.exists()


async def test_exec_workdir_and_environment(sb: BwrapSandbox) -> None:
    r = await sb.exec("echo out; echo err >&2; pwd; echo $HOME $FOO; exit 5", timeout=10, env={"FOO": "bar"})
    assert (r.exit_code, r.output) == (5, "out\nerr\n/work\n/work bar\n")
    r = await sb.exec("env | grep -c -v -E '^(PWD|OLDPWD|HOME|LANG|SHLVL|PATH|_|FOO)=' || true", timeout=10)
    assert r.output.strip() == "0"  # the host environment does not leak in
    await sb.exec("mkdir -p sub", timeout=10)
    assert (await sb.exec("pwd", timeout=10, workdir="/work/sub")).output == "/work/sub\n"
    r = await sb.exec("pwd", timeout=10, workdir="/work/missing")
    assert r.exit_code == 126 and "missing" in r.output


async def test_root_is_read_only_and_host_private_dirs_hidden(sb: BwrapSandbox, tmp_path: Path) -> None:
    r = await sb.exec("echo x > /usr/evil", timeout=10)
    assert r.exit_code != 0 and "Read-only file system" in r.output
    r = await sb.exec("mount -o remount,rw /usr", timeout=10)
    assert r.exit_code != 0
    r = await sb.exec(f"ls {tmp_path} /root 2>&1; echo x > {tmp_path}/f", timeout=10)
    assert r.exit_code != 0 and not (tmp_path / "f").exists()
    with pytest.raises(SandboxError, match="outside /work"):
        await sb.write_file("/etc/evil", "x")
    with pytest.raises(SandboxError, match="outside /work"):
        await sb.write_file("/work/../etc/evil", "x")
    await sb.exec("ln -s /etc /work/etc_link", timeout=10)
    with pytest.raises(SandboxError, match="resolves outside"):
        await sb.write_file("/work/etc_link/evil", "x")


async def test_network_is_blocked(sb: BwrapSandbox) -> None:
    r = await sb.exec("python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), timeout=3)'", 20)
    assert r.exit_code != 0 and "Network is unreachable" in r.output
    r = await sb.exec("tail -n +3 /proc/net/dev | cut -d: -f1", timeout=10)
    assert r.output.split() == ["lo"]


async def test_timeout_kills_the_jail(sb: BwrapSandbox) -> None:
    r = await sb.exec("echo started; sleep 60", timeout=1.0)
    assert r.timed_out and r.exit_code == 124 and r.output == "started\n" and r.duration_s < 5
    assert (await sb.exec("echo alive", timeout=10)).output == "alive\n"


async def test_big_output_is_capped_and_memory_limited(sb: BwrapSandbox) -> None:
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = await sb.exec("echo START; head -c 1G /dev/zero | tr '\\0' a; echo; echo END", timeout=60)
    assert r.truncated and r.output.startswith("START\n") and r.output.endswith("\nEND\n")
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024 < 100
    r = await sb.exec("python3 -c 'b = bytearray(1 << 30)'", timeout=30)
    assert r.exit_code != 0 and "MemoryError" in r.output


async def test_files(sb: BwrapSandbox, tmp_path: Path) -> None:
    await sb.write_file("/work/a/ü.txt", "héllo\n")
    assert await sb.read_file("a/ü.txt") == "héllo\n"
    assert (await sb.exec("cat /work/a/ü.txt", timeout=10)).output == "héllo\n"
    with pytest.raises(FileNotFoundError):
        await sb.read_file("/work/none")
    assert (await sb.read_file("/etc/os-release")).startswith(("PRETTY_NAME", "NAME"))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f.py").write_text("print(7)\n")
    await sb.copy_in(str(tmp_path / "d"), "/work/d")
    assert (await sb.exec("python3 d/f.py", timeout=10)).output == "7\n"
    await sb.copy_out("/work/d", str(tmp_path / "back"))
    assert (tmp_path / "back" / "f.py").read_text() == "print(7)\n"


async def test_commands_run_unprivileged_and_cannot_stop_the_sandbox(sb: BwrapSandbox) -> None:
    r = await sb.exec("id -u; id -g; grep CapEff /proc/self/status; kill -9 1; kill -9 -1; echo survived", timeout=10)
    assert r.output.startswith("1000\n1000\nCapEff:\t0000000000000000\n") and "survived" in r.output
    assert (await sb.exec("touch mine && stat -c %u mine", timeout=10)).output == "1000\n"
    assert (await sb.exec("echo alive", timeout=10)).output == "alive\n"


async def test_disk_limit_on_files_on_tmp_and_on_work() -> None:
    if shutil.which("bwrap") is None:
        missing("bubblewrap", "run `apt-get install bubblewrap`")
    limit = 32 << 20
    async with BwrapSandbox(SandboxConfig(backend="bwrap", disk_limit=limit, disk_check_s=0.3)) as box:
        r = await box.exec("head -c 1G /dev/zero > one; stat -c %s one; rm one", timeout=30)
        assert "File size limit exceeded" in r.output and str(limit) in r.output
        r = await box.exec("for i in $(seq 10); do head -c 8M /dev/zero > /tmp/f$i || break; done; df -B1 /tmp", 30)
        assert "No space left on device" in r.output and f" {limit} " in r.output  # /tmp: a tmpfs of the limit
        r = await box.exec("for i in $(seq 100); do head -c 4M /dev/zero > f$i; sleep 0.05; done; echo finished", 60)
        assert r.disk_full and "finished" not in r.output, r
        assert box.disk_used() < limit + (64 << 20)
        with pytest.raises(OSError, match="disk limit"):
            await box.write_file("/work/more.txt", "x" * (8 << 20))
        r = await box.exec("rm -f f*; echo cleaned", timeout=10)
        assert r.output == "cleaned\n" and not r.disk_full


async def test_only_bwrap_itself_failing_is_an_infra_error(sb: BwrapSandbox) -> None:
    """A command printing what bwrap prints when it fails is still the command's failure (it cannot make its
    episode an infra error); bwrap failing to set up the jail is the infrastructure's."""
    r = await sb.exec("echo 'bwrap: Creating new namespace failed'; exit 1", timeout=10)
    assert (r.exit_code, r.output) == (1, "bwrap: Creating new namespace failed\n")
    broken = BwrapSandbox(SandboxConfig(backend="bwrap", bwrap_ro_binds=("/no/such/dir",)))
    try:
        with pytest.raises(SandboxUnavailableError, match="Can't find source path"):
            await broken.exec("echo hi", timeout=10)
    finally:
        await broken.close()
