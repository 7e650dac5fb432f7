"""A sandbox host on node B of the two-node Ray cluster, driven through its client as an env would
(``acquire_sandbox`` inside ``use_pools``): commands and files run in real Docker containers; the host killed with
SIGKILL fails the sandbox it held with an error naming it, Ray restarts it, the next sandbox comes from the new
incarnation (the dead one's container is reaped); once the restarts are used up the client reports the host lost."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


def _containers_of(pid: int) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=sao.owner_pid={pid}"], capture_output=True, text=True, check=True
    )
    return out.stdout.split()


async def _mean_exec_s(sb: Any, n: int = 10) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        await sb.exec("true")
    return (time.perf_counter() - t0) / n


async def _kill(host: Any) -> dict[str, Any]:
    info: dict[str, Any] = await host.ping.remote()
    os.kill(info["pid"], signal.SIGKILL)
    return info


async def test_sandbox_host_runs_commands_dies_restarts_and_is_lost(ray_cluster: Any, base_image: str) -> None:
    import ray

    from sao.sandboxes.config import SandboxConfig
    from sao.sandboxes.docker import DockerSandbox
    from sao.sandboxes.pool import acquire_sandbox, use_pools
    from sao.sandboxes.protocols import RootCommands, SandboxUnavailableError
    from sao.trainer.cluster.sandbox_host import SandboxHostClient, SandboxHostImpl, episode_sandboxes

    host_cls: Any = ray.remote(SandboxHostImpl)
    host = host_cls.options(
        name="sao-sandbox-test", num_cpus=0, resources={"node_b": 0.01}, max_restarts=1, max_concurrency=100
    ).remote(1)
    cfg = SandboxConfig(image=base_image, mem_limit="256m")
    client = SandboxHostClient(host, "sao-sandbox-test", restart_wait_s=15)
    try:
        first = await host.ping.remote()
        node_b = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "node_b" in n["Resources"])
        assert first["node"] == node_b
        async with use_pools(client):
            mine: list[Any] = []
            episode_sandboxes.set(mine)
            sb = await acquire_sandbox(cfg)
            assert mine == [sb]  # the episode's own record of its sandboxes
            await sb.write_file("/tmp/x.txt", "hello from node b")
            assert await sb.read_file("/tmp/x.txt") == "hello from node b"
            res = await sb.exec("echo $((6 * 7)); exit 3")
            assert (res.exit_code, res.output.strip()) == (3, "42")
            assert isinstance(sb, RootCommands)  # the SWE env's own steps (repo_patch) run as root on the host too
            assert await sb.exec_as_root(["id", "-u"]) == (0, "0\n")
            assert len(_containers_of(first["pid"])) >= 1
            print(f"exec('true') through the sandbox host: {await _mean_exec_s(sb) * 1e3:.1f} ms", end="; ")
            async with await DockerSandbox.create(cfg) as direct:
                print(f"on a DockerSandbox in this process: {await _mean_exec_s(direct) * 1e3:.1f} ms")

            t0 = time.monotonic()
            await _kill(host)
            with pytest.raises(SandboxUnavailableError, match="sandbox host sao-sandbox-test died"):
                await sb.exec("true")
            assert sb.failed and "sao-sandbox-test" in sb.failed
            sb2 = await acquire_sandbox(cfg)  # waits for Ray's restart
            second = await host.ping.remote()
            print(f"sandbox host restarted and served a new sandbox in {time.monotonic() - t0:.1f} s")
            assert second["incarnation"] != first["incarnation"] and second["pid"] != first["pid"]
            assert (await sb2.exec("echo ok")).output.strip() == "ok"
            assert _containers_of(first["pid"]) == [], "the dead incarnation's containers were not reaped"
            with pytest.raises(SandboxUnavailableError, match="not on this sandbox host"):
                await sb.close()  # the old sandbox is gone with the old incarnation
            await sb2.close()

            await _kill(host)  # the one restart is used up
            with pytest.raises(SandboxUnavailableError, match="was not restarted"):
                await acquire_sandbox(cfg)
            assert client.lost is not None
    finally:
        ray.kill(host)
