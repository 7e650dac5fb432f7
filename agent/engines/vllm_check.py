"""Checks of vLLM servers SAO did not start (``rollout.vllm_urls``) before a run trusts them: the model and the
logprob mode.

The DIS ratio is ``exp(logp_trainer - logp_engine)`` on the distribution the token was drawn from (after
temperature). The servers SAO starts run with ``--logprobs-mode processed_logprobs`` (``LocalVLLMServer``); a server
started without it reports the temperature-1 (raw) logprobs, so at any other temperature every ratio is off from the
first token. What a server is, is read, not assumed:

- the model: ``GET /v1/models`` (its name and ``max_model_len``, which must hold ``rollout.max_context_tokens``) and
  ``POST /tokenize`` of a probe text, which must give the trainer tokenizer's ids (another model family splits
  text differently, and its token ids would mean other words);
- the logprob mode: ``GET /server_info`` (a server with ``VLLM_SERVER_DEV_MODE=1``, which SAO's weight sync needs
  anyway) states ``logprobs_mode``; a server that does not say is measured: a few tokens sampled at temperature 2,
  then the same tokens read back as prompt logprobs, which vLLM always reports raw. Equal: the server reports raw
  logprobs; different: processed ones.

``refusals`` is the decision, a pure function of what was read; ``check_servers`` reads and decides.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from sao.core.config import ConfigError

PROBE_TEXT = "def add(a, b):\n    return a + b\n\nThe quick brown fox jumps over the lazy dog. 12 + 30 ="
PROBE_TEMPERATURE = 2.0  # far from 1: processed and raw logprobs of a sampled token differ clearly
PROBE_TOKENS = 8
FIX = (
    "restart it with `--logprobs-mode processed_logprobs` (SAO's own servers get it: LocalVLLMServer), or leave "
    "rollout.vllm_urls empty so the run starts its own"
)


@dataclass(frozen=True)
class ServerFacts:
    """What one server says about itself. ``logprobs_mode``: from ``/server_info`` (None: it does not say);
    ``probe``: the measured mode, "processed" / "raw" (None: not measured, or no sampled token told them apart);
    ``probe_ids``: its tokenization of ``PROBE_TEXT``."""

    url: str
    model: str
    max_model_len: int | None
    probe_ids: tuple[int, ...]
    logprobs_mode: str | None = None
    probe: str | None = None


def refusals(
    facts: ServerFacts, *, temperature: float, expected_ids: Sequence[int], max_context_tokens: int, model: str
) -> list[str]:
    """Why a run at ``temperature`` (trainer model ``model``, whose tokenizer gives ``expected_ids`` for
    ``PROBE_TEXT``) must not sample from this server; empty when it may."""
    out = []
    where = f"vLLM server {facts.url} (serving {facts.model!r})"
    if tuple(expected_ids) != facts.probe_ids:
        out.append(
            f"{where}: its tokenizer splits a probe text differently from the trainer's model {model!r}: it serves "
            "another model; start it on the trainer's model (model.path)"
        )
    if facts.max_model_len is not None and facts.max_model_len < max_context_tokens:
        out.append(
            f"{where}: max_model_len {facts.max_model_len} < rollout.max_context_tokens {max_context_tokens}; "
            "restart it with a larger --max-model-len or lower rollout.max_context_tokens"
        )
    mode = facts.logprobs_mode or {"processed": "processed_logprobs", "raw": "raw_logprobs"}.get(facts.probe or "")
    if mode is None:
        out.append(f"{where}: its logprob mode could not be read (no /server_info) nor measured; {FIX}")
    elif mode in ("raw_logits", "processed_logits"):
        out.append(f"{where}: --logprobs-mode {mode} reports logits, not logprobs; {FIX}")
    elif mode == "raw_logprobs" and temperature != 1.0:
        how = "says" if facts.logprobs_mode else "measured: sampled logprobs equal the temperature-1 prompt logprobs"
        out.append(
            f"{where} reports temperature-1 logprobs (logprobs mode raw_logprobs, {how}), but the run samples at "
            f"rollout.temperature={temperature:g}: every DIS ratio would be off; {FIX}"
        )
    return out


async def _json(client: httpx.AsyncClient, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    try:
        resp = await client.request(method, url, json=body)
    except httpx.HTTPError as e:
        raise ConfigError(f"rollout.vllm_urls: {url} did not answer ({type(e).__name__}: {e}); is it running?") from e
    if resp.status_code == 404:
        return None
    if resp.status_code >= 400:
        raise ConfigError(f"rollout.vllm_urls: {url} answered HTTP {resp.status_code}: {resp.text[:300]}")
    return resp.json()


async def _mode(client: httpx.AsyncClient, url: str) -> str | None:
    """``logprobs_mode`` from the dev endpoint ``/server_info`` (None where it is off or says nothing)."""
    info = await _json(client, "GET", f"{url}/server_info?config_format=json")
    config = (info or {}).get("vllm_config")
    model_config = config.get("model_config") if isinstance(config, dict) else None
    mode = model_config.get("logprobs_mode") if isinstance(model_config, dict) else None
    return str(mode) if mode else None


def probe_verdict(sampled: Sequence[float], raw: Sequence[float]) -> str | None:
    """Verdict "raw" when the sampled tokens' reported logprobs equal their temperature-1 logprobs, "processed"
    when they clearly differ, None when no token tells (a token the model is sure of has logprob ~0 either way)."""
    diffs = [abs(s - r) for s, r in zip(sampled, raw, strict=True) if r < -0.05]
    if not diffs:
        return None
    median = statistics.median(diffs)
    return "raw" if median < 0.01 else "processed" if median > 0.1 else None


async def _probe(client: httpx.AsyncClient, url: str, model: str, ids: Sequence[int]) -> str | None:
    """Sample ``PROBE_TOKENS`` at ``PROBE_TEMPERATURE``, read them back as prompt logprobs, compare."""
    body: dict[str, Any] = {"model": model, "prompt": list(ids), "max_tokens": PROBE_TOKENS, "logprobs": 0,
                            "temperature": PROBE_TEMPERATURE, "top_p": 1.0, "return_token_ids": True}  # fmt: skip
    choice = (await _json(client, "POST", f"{url}/v1/completions", body))["choices"][0]
    tokens = [int(t) for t in choice["token_ids"]]
    sampled = [float(x) for x in choice["logprobs"]["token_logprobs"]]
    back = {"model": model, "prompt": [*ids, *tokens], "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}
    prompt_lps = (await _json(client, "POST", f"{url}/v1/completions", back))["choices"][0]["prompt_logprobs"]
    raw = [float(prompt_lps[len(ids) + j][str(t)]["logprob"]) for j, t in enumerate(tokens)]
    return probe_verdict(sampled, raw)


async def server_facts(url: str, *, measure: bool = False, timeout_s: float = 120.0) -> ServerFacts:
    """Read what ``url`` serves. ``measure``: run the probe even when ``/server_info`` states the mode."""
    url = url.rstrip("/")
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        models = await _json(client, "GET", f"{url}/v1/models")
        if not models or not models.get("data"):
            raise ConfigError(f"rollout.vllm_urls: {url}/v1/models lists no model; is it a vLLM server?")
        entry = models["data"][0]
        name = str(entry["id"])
        tok = await _json(client, "POST", f"{url}/tokenize", {"model": name, "prompt": PROBE_TEXT,
                                                                "add_special_tokens": False})  # fmt: skip
        ids = tuple(int(t) for t in (tok or {}).get("tokens", ()))
        mode = await _mode(client, url)
        probe = await _probe(client, url, name, ids) if measure or mode is None else None
    max_len = entry.get("max_model_len")
    root = str(entry.get("root") or name)
    return ServerFacts(url, root, None if max_len is None else int(max_len), ids, mode, probe)


async def check_servers(
    urls: Sequence[str], *, tokenizer: Any, temperature: float, max_context_tokens: int, model: str
) -> list[ServerFacts]:
    """Read every server and refuse (``ConfigError`` naming each problem and its fix) any a run at ``temperature``
    on ``model`` must not sample from; returns what was read."""
    expected = [int(t) for t in tokenizer.encode(PROBE_TEXT, add_special_tokens=False)]
    facts = [await server_facts(u) for u in urls]
    problems = [
        p
        for f in facts
        for p in refusals(
            f, temperature=temperature, expected_ids=expected, max_context_tokens=max_context_tokens, model=model
        )
    ]
    if problems:
        raise ConfigError("rollout.vllm_urls: " + "\n".join(problems))
    return facts
