"""VLLMEngine.receive_weights against fake servers: rank offsets, no retry, the version moves only when every
server loaded it, a server reporting another version is an error."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from sao.agent.engines.protocols import EngineError
from sao.agent.engines.vllm_engine import VLLMEngine
from sao.agent.engines.weight_sync import SyncPlan


def _engine(handler: Any, n: int = 2) -> VLLMEngine:
    urls = [f"http://s{i}:1" for i in range(n)]
    return VLLMEngine(urls, model="m", max_retries=0, transport=httpx.MockTransport(handler))


def _plan(version: int, world: int = 3) -> SyncPlan:
    return SyncPlan(version, "127.0.0.1", 1234, world, (), timeout_s=5)


async def test_each_server_gets_its_rank_and_the_version_moves_once_all_loaded() -> None:
    calls: list[tuple[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        calls.append((str(request.url), body))
        if request.url.path == "/collective_rpc":
            plan = json.loads(body["args"][0])
            return httpx.Response(200, json={"results": [{"version": plan["version"], "seconds": 0.1}]})
        return httpx.Response(200)

    e = _engine(handler)
    await e.receive_weights(_plan(4))
    assert e.version == 4
    rpc = [(u, b) for u, b in calls if u.endswith("/collective_rpc")]
    assert sorted((u, b["kwargs"]["rank_offset"]) for u, b in rpc) == [
        ("http://s0:1/collective_rpc", 1),
        ("http://s1:1/collective_rpc", 2),
    ]
    assert sum(u.endswith("/reset_prefix_cache") for u, _ in calls) == 2
    await e.close()


async def test_a_failing_server_is_not_retried_and_keeps_the_version() -> None:
    hits = {"s1": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "s1" and request.url.path == "/collective_rpc":
            hits["s1"] += 1
            return httpx.Response(500, text="WeightSyncError: could not reach the trainer's rendezvous")
        if request.url.path == "/collective_rpc":
            return httpx.Response(200, json={"results": [{"version": 4}]})
        return httpx.Response(200)

    e = _engine(handler)
    with pytest.raises(EngineError, match=r"1/2 server.*rendezvous"):
        await e.receive_weights(_plan(4))
    assert e.version == 0 and hits["s1"] == 1
    with pytest.raises(EngineError, match="world size 2"):
        await e.receive_weights(_plan(5, world=2))
    await e.close()


async def test_a_server_reporting_another_version_is_an_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/collective_rpc":
            return httpx.Response(200, json={"results": [{"version": 3}]})
        return httpx.Response(200)

    e = _engine(handler, n=1)
    with pytest.raises(EngineError, match=r"report versions \[3\], expected 4"):
        await e.receive_weights(_plan(4, world=2))
    assert e.version == 0
    await e.close()
