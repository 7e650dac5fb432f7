"""The Docker daemon restarted mid-run, on a private dockerd (its own socket and data root; the machine's daemon is
never touched): the episode in flight ends as an infra error, an episode started while the daemon is down waits
for it and then runs to a graded end."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._require import missing

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(300)]


class PrivateDockerd:
    """A second dockerd (its own bridge, no iptables) on ``root/docker.sock``; ``stop()``/``start()`` restart it.

    It gets a bridge of its own: with ``--bridge=none`` dockerd deletes the interface ``docker0`` at start, which
    breaks the machine's daemon (bridge-networked containers, e.g. the official swebench harness, then fail).
    """

    def __init__(self, root: Path, bridge: str) -> None:
        self.root = root
        self.bridge = bridge
        self.url = f"unix://{root}/docker.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cmd = ["dockerd", "--data-root", f"{self.root}/data", "--exec-root", f"{self.root}/exec"]
        cmd += ["--pidfile", f"{self.root}/docker.pid", "-H", self.url, f"--bridge={self.bridge}"]
        cmd += ["--iptables=false"]
        cmd += ["--ip-masq=false", "--storage-driver=overlay2"]
        with open(self.root / "dockerd.log", "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while subprocess.run(["docker", "-H", self.url, "info"], capture_output=True).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.root / "dockerd.log").read_text()[-2000:]
                missing("a second Docker daemon", f"dockerd did not come up on {self.url}:\n{tail}")
            time.sleep(0.3)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)


@pytest.fixture()
def dockerd(base_image: str) -> Iterator[PrivateDockerd]:
    from sao.core.paths import cache_dir

    if shutil.which("dockerd") is None:
        missing("dockerd", "run `bash scripts/setup.sh`")
    tars = sorted((cache_dir() / "images").glob("*.tar"))
    if not tars:
        missing("the base image tarball", "run `bash scripts/setup.sh`")
    if shutil.which("ip") is None:
        missing("the ip command (iproute2)", "apt-get install iproute2")
    root = Path(tempfile.mkdtemp(prefix="sao-dockerd-", dir="/tmp"))
    bridge = f"saodt{os.getpid() % 100000}"
    for cmd in (
        ["ip", "link", "add", "name", bridge, "type", "bridge"],
        ["ip", "addr", "add", "10.213.77.1/24", "dev", bridge],
        ["ip", "link", "set", bridge, "up"],
    ):
        subprocess.run(cmd, check=True, capture_output=True)
    had_docker0 = Path("/sys/class/net/docker0").exists()
    d = PrivateDockerd(root, bridge)
    try:
        d.start()
        subprocess.run(["docker", "-H", d.url, "import", str(tars[-1]), "sao-test-base:1"], check=True, timeout=300)
        yield d
        assert Path("/sys/class/net/docker0").exists() == had_docker0, "the private dockerd touched docker0"
    finally:
        if d.proc is not None and d.proc.poll() is None:  # at the end no container runs: kill, do not drain
            os.killpg(d.proc.pid, signal.SIGKILL)
            d.proc.wait(30)
        for line in reversed(Path("/proc/mounts").read_text().splitlines()):
            if str(root) in line.split()[1]:
                subprocess.run(["umount", "-l", line.split()[1]], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_daemon_restart_mid_run(dockerd: PrivateDockerd) -> None:
    from sao.envs.python_tool import PythonToolEnv

    sandbox = {"backend": "docker", "image": "sao-test-base:1", "docker_host": dockerd.url, "daemon_wait_s": 60}
    task = {"id": "t", "problem": "6*7?", "answer": "42"}

    async def run() -> None:
        in_flight, later = PythonToolEnv(sandbox=sandbox), PythonToolEnv(sandbox=sandbox)
        try:
            await in_flight.areset(options={"task": task})
            step = asyncio.create_task(in_flight.astep(call("python", code="import time; time.sleep(30)")))
            await asyncio.sleep(2)
            await asyncio.to_thread(dockerd.stop)
            _, reward, _, truncated, info = await asyncio.wait_for(step, 60)
            assert truncated and reward == 0.0 and "infra_error" in info, info
            # A new episode while the daemon is down waits for it (2 s here), then runs normally.
            t0 = time.monotonic()
            reset = asyncio.create_task(later.areset(options={"task": task}))
            await asyncio.sleep(2)
            assert not reset.done()
            await asyncio.to_thread(dockerd.start)
            await asyncio.wait_for(reset, 60)
            assert time.monotonic() - t0 >= 2
            obs, *_ = await later.astep(call("python", code="print(6 * 7)"))
            assert "42" in obs
            _, reward, terminated, _, info = await later.astep(call("submit", answer="42"))
            assert terminated and reward == 1.0 and "infra_error" not in info
        finally:
            await in_flight.aclose()
            await later.aclose()

    asyncio.run(run())
    left = subprocess.run(
        ["docker", "-H", dockerd.url, "ps", "-aq", "--filter", "label=sao.owner=sao"], capture_output=True, text=True
    )
    assert left.stdout.split() == [], "every sandbox container was removed"


def test_a_daemon_never_reached_fails_at_once(tmp_path: Path) -> None:
    from sao.sandboxes.config import SandboxConfig
    from sao.sandboxes.docker import DockerSandbox
    from sao.sandboxes.protocols import SandboxUnavailableError

    cfg = SandboxConfig(image="sao-test-base:1", docker_host=f"unix://{tmp_path}/none.sock", daemon_wait_s=60)
    t0 = time.monotonic()
    with pytest.raises(SandboxUnavailableError, match="cannot be reached"):
        DockerSandbox.create_blocking(cfg)
    assert time.monotonic() - t0 < 10
