"""The gateway alone (``sao serve --gateway``): a user's own process plays episodes, SAO records them.

A process opens each episode's session with ``POST /sessions`` (optionally ``{"session_id": "..."}``), answered with
its ``base_url`` (``/s/<key>/v1``, the key unguessable) and ``api_key``; it ends the episode with
``POST /s/<key>/close`` and a JSON body ``{"reward": 1.0, "task_id": "...", "status": "ok", "info": {...}}``; the
session's rows are then appended to ``OUT/trajectories.jsonl`` (one trajectory per row, ``sao.agent.records``) and
a summary line to ``OUT/sessions.jsonl``. An outcome nobody gave is never written as a reward: a session closed
without a reward, left idle for ``idle_s`` or still open when the gateway stops is written with
``status="infra_error"`` and ``"reward": null`` (kept, counted, never trained on) and says why in
``info["infra_error"]``. A session whose context budget ran out, closed with a reward, is a graded truncation. A
session whose rows differ from the engine's record (``SessionRecord.exactness_errors``; never expected) is written
as an infra error too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sao.agent.engines.registry import ModelSpecError, SpecOptions, build_spec_model, parse_model_spec
from sao.agent.gateway.server import CloseRequest, Gateway
from sao.agent.gateway.session import SessionRecord
from sao.agent.records import write_jsonl
from sao.core.jsonl import append_jsonl


@dataclass(frozen=True)
class StandaloneOptions:
    """``sao serve --gateway``'s options (see its ``--help``)."""

    host: str = "127.0.0.1"
    port: int = 0
    max_context_tokens: int = 4096
    max_action_tokens: int = 1024
    temperature: float = 1.0
    out: Path | None = None
    idle_s: float = 900.0
    tokenizer: str | None = None


class TrajectorySink:
    """Writes each closed session's trajectories (and a summary line) under ``out``; ``echo`` gets one line each."""

    def __init__(self, out: Path | None, echo: Callable[[str], Any] = print) -> None:
        self.out, self.echo = out, echo
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)

    def closed(self, record: SessionRecord, close: CloseRequest) -> None:
        status, info = close.status or "ok", dict(close.info)
        if close.reward is None and status != "infra_error":
            status, info["infra_error"] = "infra_error", "closed without a reward: the episode's outcome is unknown"
        if record.context_exhausted and status == "ok":
            # The context budget cut the episode (docs/gateway.md): a truncation, graded by the reward given.
            status = "truncated"
            info.setdefault("truncation_reason", "context_length")
            info.setdefault("graded", True)
        problems = record.exactness_errors()
        if problems:
            status, info["infra_error"], info["exactness_errors"] = (
                "infra_error",
                "rows differ from the engine",
                problems,
            )
        trajs = record.trajectories(
            task_id=close.task_id or record.session_id,
            env_id=close.env_id,
            reward=close.reward,
            status=status,
            info=info,
        )
        summary = {
            "session_id": record.session_id,
            "rows": len(record.rows),
            "prefix_breaks": record.prefix_breaks,
            "calls": record.calls,
            "context_exhausted": record.context_exhausted,
            "engine_errors": record.engine_errors,
            "discarded": record.discarded,
            "reward": close.reward,
            "status": status,
        }
        if self.out is not None:
            write_jsonl(self.out / "trajectories.jsonl", trajs)
            append_jsonl(self.out / "sessions.jsonl", [summary])
        self.echo(" ".join(f"{k}={v}" for k, v in summary.items()))


async def serve_gateway(gateway: Gateway, sink: TrajectorySink, options: StandaloneOptions) -> None:
    """Serve until the server stops (Ctrl-C / SIGTERM) or the task is cancelled; idle sessions are closed as they
    go idle, open ones when it ends (both as infra errors: no outcome was given)."""
    await gateway.start(options.host, options.port)
    try:
        while gateway.serving:
            await asyncio.sleep(min(1.0, options.idle_s))
            for sid in gateway.idle_sessions(options.idle_s, time.monotonic()):
                why = f"idle for {options.idle_s:g} s without a close"
                record = gateway.close_session(sid, why)
                sink.closed(record, CloseRequest(status="infra_error", info={"infra_error": why}))
    finally:
        for sid in gateway.open_sessions:
            why = "the gateway stopped before the session was closed"
            sink.closed(gateway.close_session(sid, why), CloseRequest(status="infra_error", info={"infra_error": why}))
        await gateway.stop()


async def run_standalone(model_spec: str, options: StandaloneOptions, echo: Callable[[str], Any] = print) -> None:
    """Build the engine ``model_spec`` names (``hf:DIR``, ``local:DIR``, ``vllm:URL``, an alias) and serve the
    gateway in front of it; a spec that is no token engine raises ``ModelSpecError``."""
    spec = parse_model_spec(model_spec)
    built = await build_spec_model(
        spec,
        SpecOptions(
            tokenizer=options.tokenizer,
            max_context_tokens=options.max_context_tokens,
            max_action_tokens=options.max_action_tokens,
            temperature=options.temperature,
        ),
    )
    if built.engine is None:
        raise ModelSpecError(
            f"--gateway {model_spec!r} is evaluation-only (no token ids or logprobs): the gateway records episodes "
            "for training and needs a token engine: hf:DIR, local:DIR, vllm:URL or smollm2"
        )
    context = min(options.max_context_tokens, built.max_context_tokens or options.max_context_tokens)
    sink = TrajectorySink(options.out, echo)
    gateway = Gateway(
        built.engine, built.tokenizer, max_context_tokens=context, max_action_tokens=options.max_action_tokens,
        temperature=options.temperature, open_over_http=True, on_close=sink.closed,
    )  # fmt: skip
    try:
        serving = asyncio.create_task(serve_gateway(gateway, sink, options))
        while not gateway.serving and not serving.done():
            await asyncio.sleep(0.05)
        if gateway.serving:
            url = gateway.url
            echo(f"gateway on {url}: POST {url}/sessions opens a session and answers its base_url and api_key")
            echo(f'end a session with POST {url}/s/<key>/close {{"reward": ...}}')
        await serving
    finally:
        await built.engine.close()
