"""Shared parts of the evaluation CLIs and ``sao collect``: the model SPEC parser, the player each spec makes,
durable JSONL, tables.

A model SPEC names what plays the episodes (episodes themselves run in ``sao.agent.episodes.EpisodeRunner``). The forms
are those the registered engines declare (``sao.agent.engines.registry``; the shipped ones in
``sao.agent.engines.builtin``):

- ``vllm:http://host:port[,http://...]``: running vLLM server(s), token-in/token-out (``VLLMEngine``); the
  tokenizer comes from ``--tokenizer`` or the model path the server reports.
- ``local:/path/to/checkpoint``: we launch a ``LocalVLLMServer`` on the checkpoint and stop it at the end.
- ``hf:/path/to/checkpoint``: in-process transformers (``HFEngine``); for tiny models and CPU smoke runs.
  ``local:`` and ``hf:`` also take a model alias (``smollm2``, see ``sao.core.paths.resolve_model_path``), and a
  bare alias (``--model smollm2``) means ``local:`` on it (vLLM: the engine staged runs use).
- ``solver``: the Python-tool arithmetic solver (``sao.agent.engines.solver``; tokenizer from ``--tokenizer``, default
  ``smollm2``): correct tool-use demonstrations from the env itself.
- ``openai:MODEL@BASE_URL``: any OpenAI-compatible chat endpoint (``OpenAIChatModel``; key from
  ``OPENAI_API_KEY``), e.g. ``openai:gpt-4o-mini@https://api.example.com/v1``.
- ``scripted:FILE``: a test fixture that replays fixed assistant messages per task (``sao.agent.engines.scripted``):
  a JSONL of ``{"id": <instance or problem id>, "actions": ["<assistant message>", ...]}``; a task with no line in
  the file is an error before anything runs.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sao.agent.engines import registry
from sao.agent.engines.registry import ModelSpec, ModelSpecError, SpecModel, SpecOptions
from sao.agent.episodes import Player
from sao.agent.harness.protocols import Endpoint
from sao.agent.harness.registry import DEFAULT_HARNESS, PlayerArgs, make_player
from sao.agent.loop import AgentConfig
from sao.core.console import say
from sao.core.jsonl import iter_jsonl, write_json_atomic

SPEC_HELP = registry.spec_help()


class EvalError(ValueError):
    """Bad input to an evaluation (spec, dataset, predictions file); the message names the problem and the fix."""


def parse_model_spec(spec: str) -> ModelSpec:
    """Parse ``--model``; an unknown or malformed spec raises ``EvalError`` listing the accepted forms."""
    try:
        return registry.parse_model_spec(spec)
    except ModelSpecError as e:
        raise EvalError(str(e)) from e


@dataclass
class EvalModel:
    """What plays episodes: what the spec built (``SpecModel``: a token engine + tokenizer, a chat model, or chat
    models per task) and the sampling limits. ``close()`` stops what we own."""

    spec: ModelSpec
    built: SpecModel
    max_context_tokens: int = 8192
    max_action_tokens: int = 2048
    temperature: float = 0.0
    top_p: float = 1.0

    @property
    def engine(self) -> Any:
        return self.built.engine

    @property
    def tokenizer(self) -> Any:
        return self.built.tokenizer

    def check_tasks(self, task_ids: list[str]) -> None:
        """A model that plays only some tasks (a script) must cover every task it will see."""
        if self.built.check_tasks is not None:
            try:
                self.built.check_tasks(task_ids)
            except ModelSpecError as e:
                raise EvalError(str(e)) from e

    def player(
        self, *, max_turns: int, render_check_every: int = 0, harness: str = DEFAULT_HARNESS, harness_config: str = ""
    ) -> Player:
        """What plays this model's episodes in ``sao.agent.episodes.EpisodeRunner``: ``harness`` (a name of
        ``sao.agent.harness.registry``: SAO's own loop, or an outside agent such as mini-swe-agent, which calls a
        token engine through SAO's gateway or an ``openai:`` endpoint directly) with ``harness_config``; an outside
        agent's step limit is ``max_turns``."""
        b = self.built
        cfg = AgentConfig(
            max_context_tokens=self.max_context_tokens,
            max_action_tokens=min(self.max_action_tokens, self.max_context_tokens // 2),
            max_turns=max_turns,
            temperature=self.temperature,
            top_p=self.top_p,
        )
        endpoint = None
        if b.engine is None and self.spec.base_url:  # an OpenAI-compatible endpoint an outside agent can call
            params = {"temperature": self.temperature, "max_tokens": cfg.max_action_tokens}
            key = os.environ.get("OPENAI_API_KEY") or "none"
            endpoint = Endpoint(self.spec.base_url, self.spec.model, key, params, recorded=False)
        args = PlayerArgs(cfg, b.engine, b.tokenizer, b.chat, b.per_task, endpoint, harness_config, render_check_every)
        try:
            return make_player(harness, args)
        except ValueError as e:
            raise EvalError(f"--agent {harness}: {e}") from e

    async def close(self) -> None:
        for part in (self.built.engine, self.built.chat):
            if part is not None:
                await part.close()


async def build_model(
    spec: ModelSpec,
    *,
    tokenizer: str | None = None,
    max_context_tokens: int | None = None,
    max_action_tokens: int | None = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    turns_in_context: int = 8,
    tasks: tuple[Any, ...] = (),
) -> EvalModel:
    """Make the model a spec names (the registry entry of ``spec.kind`` builds it; ``local:`` starts a server).

    A limit left None is the model's own (``SpecOptions``): the context its config allows (at most
    ``registry.CONTEXT_CAP``) and ``1 / turns_in_context`` of it per turn."""
    if (max_context_tokens is not None and max_context_tokens < 2) or (max_action_tokens or 1) < 1:
        raise EvalError(f"--max-context {max_context_tokens} / --max-tokens {max_action_tokens}: too small")
    options = SpecOptions(
        tokenizer, max_context_tokens, max_action_tokens, temperature, top_p, turns_in_context, tasks=tuple(tasks)
    )
    try:
        built = await registry.build_spec_model(spec, options)
    except ModelSpecError as e:
        raise EvalError(str(e)) from e
    context = built.max_context_tokens or options.context_for(None)
    m = EvalModel(
        spec, built, max_context_tokens=context, max_action_tokens=options.action_for(context),
        temperature=temperature, top_p=top_p,
    )  # fmt: skip
    if m.max_context_tokens < 2:
        await m.close()
        raise EvalError(f"--max-context {m.max_context_tokens} is too small")
    return m


@contextlib.asynccontextmanager
async def opened_model(spec: ModelSpec, task_ids: list[str], **build: Any) -> AsyncIterator[EvalModel]:
    """``build_model(spec, **build)``, checked against the task ids it will see, closed at the end."""
    model = await build_model(spec, **build)
    if model.engine is not None:  # the limits it runs with, defaults included: a slow run is explained here
        limits = f"context {model.max_context_tokens} tokens, at most {model.max_action_tokens} sampled per turn"
        say(f"model {spec.name}: {limits}")
    try:
        model.check_tasks(task_ids)
        yield model
    finally:
        await model.close()


# ---- files ----------------------------------------------------------------------------------------------------
def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line, flushed and fsynced (an interrupted run keeps everything already written)."""
    from sao.core import jsonl

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
    """Write JSON atomically and durably (``trainer.runs.run_folder.write_json_atomic``)."""
    write_json_atomic(path, data, indent=2)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct: ``1 - C(n-c, k) / C(n, k)``."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)
