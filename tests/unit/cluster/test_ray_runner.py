"""RayRolloutRunner's bookkeeping with fake worker handles: least-busy choice, a dead worker's episode becomes an
infra error and the worker is not used again, version notices skip dead workers."""

from __future__ import annotations

import asyncio
from typing import Any

from sao.agent.episodes import Episode
from sao.agent.records import Trajectory
from sao.trainer.cluster.ray_backend import RayRolloutRunner


class _Method:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Any:
        return self.fn(*args)


class FakeWorker:
    def __init__(self, name: str, die: bool = False) -> None:
        self.name, self.die, self.calls = name, die, 0
        self.versions: list[int] = []
        self.run_one = _Method(self._run_one)
        self.set_version = _Method(self.versions.append)

    async def _run_one(self, ep: Episode) -> Trajectory:
        import ray

        self.calls += 1
        await asyncio.sleep(0.01)
        if self.die:
            raise ray.exceptions.RayActorError()
        return Trajectory(ep.task_id or "t", "sao/TokenGame-v0", (), 1.0, "ok", {"by": self.name}, {})


async def test_a_dead_worker_gives_an_infra_error_and_is_dropped() -> None:
    a, b = FakeWorker("a"), FakeWorker("b", die=True)
    runner = RayRolloutRunner([a, b], ["sao-rollout-0", "sao-rollout-1"], "sao/TokenGame-v0")
    first = await asyncio.gather(*(runner.run_one(Episode(i, None, i, f"t{i}")) for i in range(2)))
    assert sorted(t.status for t in first) == ["infra_error", "ok"]  # least busy: one episode each
    dead = next(t for t in first if t.status == "infra_error")
    assert "sao-rollout-1 died" in dead.info["infra_error"]
    later = await asyncio.gather(*(runner.run_one(Episode(i, None, i, f"t{i}")) for i in range(2, 6)))
    assert all(t.status == "ok" and t.info["by"] == "a" for t in later)
    assert b.calls == 1
    runner.set_version(3)
    assert a.versions == [3] and b.versions == []


async def test_no_live_worker_left_is_an_infra_error_not_a_crash() -> None:
    runner = RayRolloutRunner([FakeWorker("x", die=True)], ["sao-rollout-0"], "sao/TokenGame-v0")
    await runner.run_one(Episode(0, None, 0, "t0"))
    t = await runner.run_one(Episode(1, None, 1, "t1"))
    assert t.status == "infra_error" and "no live rollout worker" in t.info["infra_error"]


async def test_a_worker_whose_sandbox_host_is_lost_gets_no_more_episodes() -> None:
    class LostHostWorker(FakeWorker):
        async def _run_one(self, ep: Episode) -> Trajectory:
            self.calls += 1
            info = {"infra_error": "sandbox host sao-sandbox-1 is gone", "sandbox_host_lost": "gone"}
            return Trajectory(ep.task_id or "t", "sao/TokenGame-v0", (), 0.0, "infra_error", info, {})

    a, b = FakeWorker("a"), LostHostWorker("b")
    runner = RayRolloutRunner([a, b], ["sao-rollout-0", "sao-rollout-1"], "sao/TokenGame-v0")
    first = await asyncio.gather(*(runner.run_one(Episode(i, None, i, f"t{i}")) for i in range(2)))
    assert sorted(t.status for t in first) == ["infra_error", "ok"]
    later = await asyncio.gather(*(runner.run_one(Episode(i, None, i, f"t{i}")) for i in range(2, 6)))
    assert all(t.status == "ok" for t in later) and b.calls == 1
