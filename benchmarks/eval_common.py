"""Shared parts of the evaluation CLIs and ``sao collect``: the one model SPEC parser, the player each spec makes,
durable JSONL, tables.

A model SPEC names what plays the episodes (episodes themselves run in ``agent.rollout.EpisodeRunner``):

- ``vllm:http://host:port[,http://...]``: running vLLM server(s), token-in/token-out (``VLLMEngine``); the
  tokenizer comes from ``--tokenizer`` or the model path the server reports.
- ``local:/path/to/checkpoint``: we launch a ``LocalVLLMServer`` on the checkpoint and stop it at the end.
- ``hf:/path/to/checkpoint``: in-process transformers (``HFEngine``); for tiny models and CPU smoke runs.
  ``local:`` and ``hf:`` also take a model alias (``smollm2``, see ``saocore.paths.resolve_model_path``), and a
  bare alias (``--model smollm2``) means ``hf:`` on it.
- ``solver``: the Python-tool arithmetic solver (``agent.engines.solver``; tokenizer from ``--tokenizer``, default
  ``smollm2``): correct tool-use demonstrations from the env itself.
- ``openai:MODEL@BASE_URL``: any OpenAI-compatible chat endpoint (``OpenAIChatModel``; key from
  ``OPENAI_API_KEY``), e.g. ``openai:gpt-4o-mini@https://api.example.com/v1``.
- ``scripted:FILE``: a test fixture that replays fixed assistant messages per task: a JSONL of
  ``{"id": <instance or problem id>, "actions": ["<assistant message>", ...]}``; the same script is replayed for
  every sample of a task, and a task with no line in the file is an error before anything runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.engines.openai_chat import ChatReply
from agent.engines.protocols import EngineError
from agent.loop import AgentConfig
from agent.rollout import ChatPlayer, Player, TokenPlayer
from saocore.jsonl import iter_jsonl
from saocore.paths import MODEL_ALIASES, resolve_model_path
from trainer.run_folder import write_json_atomic

SPEC_HELP = (
    "vllm:http://host:port[,http://...] | local:/path/to/checkpoint | hf:/path/to/checkpoint | smollm2 | "
    "openai:MODEL@BASE_URL | scripted:FILE.jsonl | solver"
)


class EvalError(ValueError):
    """Bad input to an evaluation (spec, dataset, predictions file); the message names the problem and the fix."""


@dataclass(frozen=True)
class ModelSpec:
    """A parsed ``--model`` value: ``kind`` in vllm/local/hf/openai/scripted/solver and its target(s)."""

    kind: str
    urls: tuple[str, ...] = ()
    path: str = ""
    model: str = ""
    base_url: str = ""

    @property
    def name(self) -> str:
        """``model_name_or_path`` for predictions files."""
        if self.kind == "vllm":
            return self.model or self.urls[0]
        if self.kind == "openai":
            return self.model
        return self.path or self.kind


def parse_model_spec(spec: str) -> ModelSpec:
    """Parse ``--model``; an unknown or malformed spec raises ``EvalError`` listing the accepted forms."""
    if spec.strip() == "solver":
        return ModelSpec("solver")
    kind, sep, rest = spec.partition(":")
    rest = rest.strip()
    if not sep and spec.strip().lower() in MODEL_ALIASES:
        path = resolve_model_path(spec)
        if not Path(path, "config.json").is_file():
            raise EvalError(f"--model {spec!r}: the alias names {path}, which holds no model; run scripts/setup.sh")
        return ModelSpec("hf", path=path)
    if not sep or not rest:
        raise EvalError(f"--model {spec!r}: expected KIND:TARGET, one of {SPEC_HELP}")
    if kind == "vllm":
        urls = tuple(u.strip().rstrip("/") for u in rest.split(",") if u.strip())
        bad = [u for u in urls if not u.startswith(("http://", "https://"))]
        if not urls or bad:
            raise EvalError(f"--model {spec!r}: vllm: needs http(s) server URLs, e.g. vllm:http://127.0.0.1:8000")
        return ModelSpec("vllm", urls=urls)
    if kind in ("local", "hf"):
        path = resolve_model_path(rest)  # an alias (smollm2) or a directory
        if not Path(path, "config.json").is_file():
            raise EvalError(f"--model {spec!r}: {path} is not a model directory (no config.json)")
        return ModelSpec(kind, path=path)
    if kind == "openai":
        at = max(rest.rfind("@http://"), rest.rfind("@https://"))
        if at <= 0:
            raise EvalError(
                f"--model {spec!r}: openai: needs MODEL@BASE_URL, e.g. openai:my-model@http://127.0.0.1:8000/v1"
            )
        return ModelSpec("openai", model=rest[:at], base_url=rest[at + 1 :])
    if kind == "scripted":
        path = str(Path(rest).expanduser())
        if not Path(path).is_file():
            raise EvalError(f"--model {spec!r}: script file {path} does not exist")
        return ModelSpec("scripted", path=path)
    raise EvalError(f"--model {spec!r}: unknown model kind {kind!r}; use one of {SPEC_HELP}")


def load_script(path: str | Path) -> dict[str, list[str]]:
    """A scripted model's actions per task id; errors name the line."""
    out: dict[str, list[str]] = {}
    for n, rec in iter_jsonl(path, error=EvalError):
        tid = rec.get("id", rec.get("instance_id")) if isinstance(rec, dict) else None
        actions = rec.get("actions") if isinstance(rec, dict) else None
        if tid is None or not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
            raise EvalError(f'{path}:{n}: expected {{"id": <task id>, "actions": ["<assistant message>", ...]}}')
        out[str(tid)] = actions
    return out


class _ScriptedChat:
    """Replays one task's actions as chat replies; past the end it raises EngineError (the script ran out)."""

    def __init__(self, task_id: str, actions: list[str]) -> None:
        self.task_id, self.actions, self.i = task_id, actions, 0

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> ChatReply:
        if self.i >= len(self.actions):
            raise EngineError(f"the script for {self.task_id} has no action left (it has {len(self.actions)})")
        self.i += 1
        return ChatReply(self.actions[self.i - 1])


@dataclass
class EvalModel:
    """What plays episodes: a token engine + tokenizer, a chat model, or a script. ``close()`` stops what we own."""

    spec: ModelSpec
    engine: Any = None
    tokenizer: Any = None
    chat: Any = None
    script: dict[str, list[str]] = field(default_factory=dict)
    max_context_tokens: int = 8192
    max_action_tokens: int = 2048
    temperature: float = 0.0
    top_p: float = 1.0

    def check_tasks(self, task_ids: list[str]) -> None:
        """A scripted model must have a script for every task it will see."""
        if self.spec.kind == "scripted":
            lacking = [t for t in task_ids if t not in self.script]
            if lacking:
                raise EvalError(
                    f"{self.spec.path} has no actions for {len(lacking)} task(s), e.g. {lacking[:3]}; add lines "
                    '{"id": ..., "actions": [...]} for them or select fewer tasks'
                )

    def player(self, *, max_turns: int, render_check_every: int = 0) -> Player:
        """What plays this model's episodes in ``agent.rollout.EpisodeRunner``."""
        if self.engine is not None:
            cfg = AgentConfig(
                max_context_tokens=self.max_context_tokens,
                max_action_tokens=min(self.max_action_tokens, self.max_context_tokens // 2),
                max_turns=max_turns,
                temperature=self.temperature,
                top_p=self.top_p,
            )
            return TokenPlayer(self.engine, self.tokenizer, cfg, render_check_every=render_check_every)
        if self.chat is not None:
            return ChatPlayer(self.chat, max_turns=max_turns)
        script = self.script
        return ChatPlayer(per_task=lambda task_id: _ScriptedChat(task_id, script.get(task_id, [])), max_turns=max_turns)

    async def close(self) -> None:
        for part in (self.engine, self.chat):
            if part is not None:
                await part.close()


def _load_tokenizer(source: str) -> Any:
    from transformers import AutoTokenizer

    path = resolve_model_path(source)  # an alias (smollm2) or a directory
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as e:
        where = source if path == source else f"{source} ({path})"
        raise EvalError(
            f"cannot load the tokenizer from {where!r} ({type(e).__name__}: {e}); pass --tokenizer DIR "
            "(the served model's directory)"
        ) from e


async def _server_model(url: str) -> tuple[str, int | None]:
    import httpx

    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            data = (await client.get(url + "/v1/models")).json()["data"][0]
    except Exception as e:
        raise EvalError(f"vLLM server {url} did not answer /v1/models ({type(e).__name__}: {e}); is it running?") from e
    return str(data.get("root") or data["id"]), data.get("max_model_len")


async def build_model(
    spec: ModelSpec,
    *,
    tokenizer: str | None = None,
    max_context_tokens: int = 8192,
    max_action_tokens: int = 2048,
    temperature: float = 0.0,
    top_p: float = 1.0,
) -> EvalModel:
    """Make the model a spec names (starting a local vLLM server for ``local:``)."""
    m = EvalModel(
        spec, max_context_tokens=max_context_tokens, max_action_tokens=max_action_tokens, temperature=temperature,
        top_p=top_p,
    )  # fmt: skip
    if spec.kind == "scripted":
        m.script = load_script(spec.path)
    elif spec.kind == "solver":
        from agent.engines.solver import SolverEngine

        m.tokenizer = _load_tokenizer(tokenizer or resolve_model_path("smollm2"))
        m.engine = SolverEngine(m.tokenizer)
    elif spec.kind == "openai":
        from agent.engines.openai_chat import OpenAIChatModel

        m.chat = OpenAIChatModel(spec.base_url, spec.model, temperature=temperature, max_tokens=max_action_tokens)
    elif spec.kind == "hf":
        from agent.engines.hf_engine import HFEngine

        m.engine = await asyncio.to_thread(HFEngine, spec.path)
        m.tokenizer = _load_tokenizer(tokenizer) if tokenizer else m.engine.tokenizer
        limit = getattr(m.engine.model.config, "max_position_embeddings", None)
        if limit:
            m.max_context_tokens = min(max_context_tokens, int(limit))
    elif spec.kind == "local":
        from agent.engines.vllm_engine import VLLMEngine
        from agent.engines.vllm_server import LocalVLLMServer

        m.tokenizer = _load_tokenizer(tokenizer or spec.path)
        # vLLM refuses a max_model_len above the model's own limit: clamp to config.json's.
        limit = json.loads(Path(spec.path, "config.json").read_text()).get("max_position_embeddings")
        if limit:
            m.max_context_tokens = min(max_context_tokens, int(limit))
        server = await asyncio.to_thread(LocalVLLMServer.start, spec.path, max_model_len=m.max_context_tokens)
        m.engine = VLLMEngine([server.url], servers=[server])
    else:
        from agent.engines.vllm_engine import VLLMEngine

        served, max_len = await _server_model(spec.urls[0])
        m.tokenizer = _load_tokenizer(tokenizer or served)
        if max_len:
            m.max_context_tokens = min(max_context_tokens, int(max_len))
        m.engine = VLLMEngine(spec.urls)
    if m.max_context_tokens < 2:
        raise EvalError(f"--max-context {m.max_context_tokens} is too small")
    return m


@contextlib.asynccontextmanager
async def opened_model(spec: ModelSpec, task_ids: list[str], **build: Any) -> AsyncIterator[EvalModel]:
    """``build_model(spec, **build)``, checked against the task ids it will see, closed at the end."""
    model = await build_model(spec, **build)
    try:
        model.check_tasks(task_ids)
        yield model
    finally:
        await model.close()


# ---- files ----------------------------------------------------------------------------------------------------
def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line, flushed and fsynced (an interrupted run keeps everything already written)."""
    from saocore import jsonl

    path.parent.mkdir(parents=True, exist_ok=True)
    jsonl.append_jsonl(path, [record])


def read_jsonl_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) of a JSONL file we wrote; a torn last line (a crash mid-write) is skipped."""
    if not path.exists():
        return
    fix = "delete the line or the --out folder"
    for n, rec in iter_jsonl(path, torn_tail_ok=True, error=EvalError, fix=fix):
        if isinstance(rec, dict):
            yield n, rec


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically and durably (``trainer.run_folder.write_json_atomic``)."""
    write_json_atomic(path, data, indent=2)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct: ``1 - C(n-c, k) / C(n, k)``."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def progress(total: int, label: str) -> Any:
    """A rich progress bar (on stderr) for ``total`` episodes."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
        console=Console(stderr=True),
    )  # fmt: skip
