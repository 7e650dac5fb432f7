"""What a command run by the agent cannot reach, in both backends: the network, the Docker socket, the host's files
(the checkout, the SAO cache with datasets and task records, other temp dirs), another episode's sandbox, and
privileges to undo any of that. The grader's own files are checked per env (tests/integration/swe/)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sao.sandboxes.config import SandboxConfig
from sao.sandboxes.protocols import Sandbox
from tests._require import missing

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[3]

Factory = Callable[[], Any]


@pytest.fixture(params=[pytest.param("docker", marks=pytest.mark.docker), "bwrap"])
async def make_box(request: pytest.FixtureRequest) -> AsyncIterator[Factory]:
    """A factory of sandboxes of one backend; every sandbox it made is closed at the end."""
    made: list[Sandbox] = []
    if request.param == "docker":
        base = request.getfixturevalue("base_image")
        request.getfixturevalue("no_leftovers")
        from sao.sandboxes.docker import DockerSandbox

        cfg = SandboxConfig(image=base, mem_limit="256m", cpus=1.0, pids_limit=64, kill_grace_s=3.0)

        async def make() -> Sandbox:
            made.append(await DockerSandbox.create(cfg))
            return made[-1]
    else:
        if shutil.which("bwrap") is None:
            missing("bubblewrap", "run `apt-get install bubblewrap`")
        from sao.sandboxes.bwrap import BwrapSandbox

        async def make() -> Sandbox:
            made.append(await BwrapSandbox.create(SandboxConfig(backend="bwrap", mem_limit="512m")))
            return made[-1]

    yield make
    for box in made:
        await box.close()


@pytest.fixture()
def host_listener() -> Iterator[int]:
    """A TCP server on every host interface that answers any connection; yields its port."""
    srv = socket.create_server(("0.0.0.0", 0))
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            conn.sendall(b"hello from the host\n")
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield int(srv.getsockname()[1])
    stop.set()
    t.join()
    srv.close()


def _host_addresses() -> list[str]:
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    return ["127.0.0.1", *[a for a in out if ":" not in a]]


CONNECT = (
    "import socket, sys\n"
    "for host in sys.argv[2:]:\n"
    "    try:\n"
    "        s = socket.create_connection((host, int(sys.argv[1])), timeout=2)\n"
    "        print('REACHED', host, s.recv(64))\n"
    "    except OSError as e:\n"
    "        print('blocked', host, type(e).__name__)\n"
)


async def _py(box: Sandbox, code: str, *args: str, timeout: float = 30) -> str:
    await box.write_file(_scratch(box) + "/probe.py", code)
    r = await box.exec(f"python3 {_scratch(box)}/probe.py {' '.join(args)}", timeout=timeout)
    return r.output


def _scratch(box: Sandbox) -> str:
    return "/work" if type(box).__name__ == "BwrapSandbox" else "/tmp"


async def test_no_network_not_even_the_host(make_box: Factory, host_listener: int) -> None:
    box = await make_box()
    # The listener answers on the host (the check can fail) ...
    with socket.create_connection(("127.0.0.1", host_listener), timeout=2) as s:
        assert s.recv(64).startswith(b"hello")
    # ... but not from inside: loopback is the sandbox's own, the host's addresses and the internet are unreachable.
    out = await _py(box, CONNECT, str(host_listener), *_host_addresses(), "172.17.0.1", "1.1.1.1")
    assert "REACHED" not in out and out.count("blocked") == len(_host_addresses()) + 2, out
    r = await box.exec("tail -n +3 /proc/net/dev | cut -d: -f1", timeout=10)
    assert r.output.split() == ["lo"], r.output


async def test_no_docker_socket_and_no_privileges(make_box: Factory) -> None:
    box = await make_box()
    r = await box.exec(
        "for p in /var/run/docker.sock /run/docker.sock /run/containerd/containerd.sock; do "
        "[ -e $p ] && echo FOUND $p; done; echo DOCKER_HOST=${DOCKER_HOST:-}; grep CapEff /proc/self/status",
        timeout=10,
    )
    assert "FOUND" not in r.output and "DOCKER_HOST=\n" in r.output, r.output
    assert "CapEff:\t0000000000000000" in r.output, r.output
    r = await box.exec(f"mkdir -p {_scratch(box)}/m && mount -t tmpfs none {_scratch(box)}/m", timeout=10)
    assert r.exit_code != 0, r.output


async def test_host_files_are_out_of_reach(make_box: Factory, tmp_path: Path) -> None:
    from sao.core.paths import cache_dir

    token = uuid.uuid4().hex
    marker = tmp_path / f"marker-{token}"
    marker.write_text(token)
    box = await make_box()
    paths = [marker, ROOT / "pyproject.toml", cache_dir(), Path.home() / ".ssh", Path("/var/lib/docker")]
    r = await box.exec(" ; ".join(f"[ -e {p} ] && echo VISIBLE {p}" for p in paths) + " ; true", timeout=10)
    assert "VISIBLE" not in r.output, r.output
    r = await box.exec("cat /proc/self/mountinfo", timeout=10)
    for p in (tmp_path, ROOT, cache_dir()):
        assert str(p) not in r.output, (p, r.output)
    r = await box.exec(f"grep -rls {token} /tmp /work /root /home 2>/dev/null; true", timeout=60)
    assert token not in r.output


async def test_another_episode_is_out_of_reach(make_box: Factory) -> None:
    a, b = await make_box(), await make_box()
    secret = uuid.uuid4().hex
    await a.write_file(f"{_scratch(a)}/secret.txt", secret)
    listen = (
        "import socket, time\n"
        "s = socket.create_server(('0.0.0.0', 47801))\n"
        "s.settimeout(3)\n"
        "try:\n    s.accept()[0].sendall(b'from a')\nexcept OSError:\n    pass\n"
    )
    await a.write_file(f"{_scratch(a)}/listen.py", listen)
    # A's process runs (listening, named by its argument) while B looks for it, its files and its port.
    a_task = asyncio.create_task(a.exec(f"python3 {_scratch(a)}/listen.py {secret}", timeout=20))
    await asyncio.sleep(1.0)
    try:
        r = await b.exec(
            f"cat {_scratch(a)}/secret.txt; grep -l {secret} /proc/[0-9]*/cmdline; "
            f"grep -rls {secret} {_scratch(b)} /tmp 2>/dev/null; hostname; true",
            timeout=20,
        )
        assert secret not in r.output, r.output
        out = await _py(b, CONNECT, "47801", "127.0.0.1")
        assert "REACHED" not in out, out
        ra = await a.exec("hostname", timeout=10)
        if type(a).__name__ == "DockerSandbox":
            assert ra.output != r.output.splitlines()[-1] + "\n"
    finally:
        await a_task
    assert (await a.read_file(f"{_scratch(a)}/secret.txt")) == secret  # the check could have found it


@pytest.mark.docker
async def test_docker_sandboxes_share_no_pid_or_ipc_namespace(base_image: str, no_leftovers: None) -> None:
    from sao.sandboxes.docker import DockerSandbox

    cfg = SandboxConfig(image=base_image, mem_limit="256m", cpus=1.0, pids_limit=64)
    async with await DockerSandbox.create(cfg) as a, await DockerSandbox.create(cfg) as b:
        ns_a = (await a.exec("readlink /proc/self/ns/pid /proc/self/ns/ipc /proc/self/ns/net", timeout=10)).output
        ns_b = (await b.exec("readlink /proc/self/ns/pid /proc/self/ns/ipc /proc/self/ns/net", timeout=10)).output
        assert set(ns_a.split()).isdisjoint(ns_b.split()), (ns_a, ns_b)
        host = {os.readlink(f"/proc/self/ns/{n}") for n in ("pid", "ipc", "net")}
        assert host.isdisjoint(ns_a.split())
