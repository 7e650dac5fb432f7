"""The engine registry: ``register_engine(name, ...)``; every choice of an inference engine is looked up here.

An ``EngineSpec`` carries everything the rest of the code branches on, so config validation, the trainer, the Ray
placement, staged runs, ``collect`` stages and the eval ``--model`` specs read the entry, never the name:

* ``in_process``: builds the engine on a model object in the caller's process (the trainer's own copy of the
  actor, a staged eval's model): the engine follows the trainer's weights without a server;
* ``serve`` / ``connect``: starts one server on a model directory / makes a client of server URLs (a server
  engine: the trainer starts one when ``rollout.vllm_urls`` is empty, Ray starts one per engine actor);
* ``weight_sync``: the ``rollout.weight_sync`` kinds the trainer may use with it;
* ``restricted_vocab``: it can sample from ``rollout.action_vocab`` only (the in-process builder gets the ids);
* ``ray_actor``: ``cluster.backend: ray`` places ``cluster.engines`` actors that each run ``serve`` on their node;
* ``specs``: the ``--model KIND:TARGET`` forms it answers to (``SpecForm``: parse the target, build the model);
* ``demonstrator``: builds it for a ``collect`` stage from the tasks its episodes will play.

The shipped engines register in ``sao.agent.engines.builtin`` (imported with the package, so every lookup sees them);
an engine from outside the package is one module that calls ``register_engine`` (docs/register_engine.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from sao.agent.engines.protocols import Engine
from sao.core.registry import Registry, unknown_name

WEIGHT_SYNC_KINDS = ("checkpoint", "broadcast")


class ModelSpecError(ValueError):
    """A bad ``--model`` spec or a bad thing it names (no model there, a malformed script, a server that does not
    answer); the message names the problem and the fix."""


class Server(Protocol):
    """One running inference server (``serve``'s result): reached at ``url``, ``proc`` its process."""

    url: str
    proc: Any

    def alive(self) -> bool: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class InProcessArgs:
    """What an in-process engine is built from: ``model`` (an ``nn.Module``: the trainer's private copy of the
    actor, or a stage's loaded model), its tokenizer, the policy version it holds, the token ids sampling is
    restricted to (``rollout.action_vocab``; empty: the full vocabulary) and the sampler's seed."""

    model: Any
    tokenizer: Any
    version: int = 0
    allowed_token_ids: tuple[int, ...] = ()
    seed: int | None = 0


@dataclass(frozen=True)
class ServeArgs:
    """What a server is started from: a HF model directory on this node, the address it binds (``0.0.0.0`` to
    serve other nodes), its log file and context length."""

    model_dir: str
    host: str = "127.0.0.1"
    log_path: str | None = None
    max_model_len: int = 2048


@dataclass(frozen=True)
class ModelSpec:
    """A parsed ``--model`` value: ``kind`` (a ``SpecForm.kind``) and its target(s)."""

    kind: str
    urls: tuple[str, ...] = ()
    path: str = ""
    model: str = ""
    base_url: str = ""

    @property
    def name(self) -> str:
        """``model_name_or_path`` for predictions files: the served or named model, else the path, else the kind."""
        return self.model or (self.urls[0] if self.urls else "") or self.path or self.kind


CONTEXT_CAP = 32768
"""The most context a spec's model gets when none is asked: KV memory and prefill time grow with it."""


@dataclass(frozen=True)
class SpecOptions:
    """The eval CLI's options a spec's model is built with. ``max_context_tokens`` None: what the model allows
    (``max_position_embeddings``, a server's ``max_model_len``), at most ``CONTEXT_CAP``; ``max_action_tokens``
    None: ``1 / turns_in_context`` of the context, so the env's prompt and several turns fit."""

    tokenizer: str | None = None
    max_context_tokens: int | None = None
    max_action_tokens: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    turns_in_context: int = 8
    tasks: tuple[Any, ...] = ()
    """The task records the episodes will play (a demonstrator works from them; empty: not known)."""

    def context_for(self, model_limit: int | None) -> int:
        """The context to run with: the asked one (else ``CONTEXT_CAP``), never past the model's own limit."""
        asked = self.max_context_tokens or CONTEXT_CAP
        return min(asked, int(model_limit)) if model_limit else asked

    def action_for(self, context: int) -> int:
        """Tokens sampled per turn at most: the asked number, else a share of ``context``."""
        return self.max_action_tokens or max(1, context // self.turns_in_context)


@dataclass
class SpecModel:
    """What a spec builds: a token ``engine`` with its ``tokenizer``, or a ``chat`` model, or ``per_task`` chat
    models (a fresh one per task id). ``max_context_tokens``: the context it runs with (``SpecOptions.context_for``
    of the model's own limit), None when the model declares none.
    ``check_tasks`` raises ``ModelSpecError`` for task ids it cannot play (before any episode runs)."""

    engine: Any = None
    tokenizer: Any = None
    chat: Any = None
    per_task: Callable[[str], Any] | None = None
    max_context_tokens: int | None = None
    check_tasks: Callable[[list[str]], None] | None = None


@dataclass(frozen=True)
class SpecForm:
    """One ``--model`` form: ``KIND:TARGET`` (or the bare ``KIND`` when ``bare``). ``usage`` is shown in help and
    errors; ``parse(spec_text, target) -> ModelSpec`` checks the target cheaply (no model is loaded) and raises
    ``ModelSpecError``; ``build(spec, options)`` makes the model. ``takes_alias``: a bare model alias
    (``--model smollm2``) means this form on it."""

    kind: str
    usage: str
    parse: Callable[[str, str], ModelSpec]
    build: Callable[[ModelSpec, SpecOptions], Awaitable[SpecModel]]
    bare: bool = False
    takes_alias: bool = False


@dataclass(frozen=True)
class EngineSpec:
    """A registered engine (see the module doc for what each field decides)."""

    name: str
    summary: str
    in_process: Callable[[InProcessArgs], Engine] | None = None
    serve: Callable[[ServeArgs], Server] | None = None
    connect: Callable[[Sequence[str], Sequence[Server]], Engine] | None = None
    weight_sync: tuple[str, ...] = ()
    restricted_vocab: bool = False
    ray_actor: bool = False
    specs: tuple[SpecForm, ...] = ()
    demonstrator: Callable[[Any, list[dict[str, Any]]], Engine] | None = None

    @property
    def placement(self) -> Literal["in_process", "server"] | None:
        """Where a training run's engine lives: in the trainer's process, in servers, or None (cannot train)."""
        if self.in_process is not None:
            return "in_process"
        return "server" if self.connect is not None else None

    def check(self) -> None:
        """Refuse an entry whose fields contradict each other (raised by ``register_engine``)."""
        where = f"register_engine({self.name!r})"
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"an engine name must be a non-empty string, got {self.name!r}")
        if self.in_process is not None and self.connect is not None:
            raise ValueError(f"{where}: give in_process or connect, not both (an engine lives in one place)")
        bad = [k for k in self.weight_sync if k not in WEIGHT_SYNC_KINDS]
        if bad:
            raise ValueError(f"{where}: weight_sync kinds {bad} unknown; use {list(WEIGHT_SYNC_KINDS)}")
        if self.placement is not None and not self.weight_sync:
            raise ValueError(f"{where}: a trainable engine needs weight_sync kinds, e.g. ('checkpoint',)")
        if self.placement is None and self.weight_sync:
            raise ValueError(f"{where}: weight_sync without in_process or connect: nothing would receive weights")
        if self.ray_actor and (self.serve is None or self.connect is None):
            raise ValueError(f"{where}: ray_actor needs serve and connect (each actor serves, workers connect)")
        if self.serve is not None and self.connect is None:
            raise ValueError(f"{where}: serve without connect: nothing could talk to the servers it starts")
        if self.restricted_vocab and self.in_process is None:
            raise ValueError(f"{where}: restricted_vocab needs in_process (the builder gets the allowed ids)")


ENGINES: Registry[EngineSpec] = Registry("engine", describe=lambda e: e.summary)


def register_engine(name: str, summary: str, **fields: Any) -> EngineSpec:
    """Register engine ``name`` (``fields``: those of ``EngineSpec``); a taken name, a taken ``--model`` kind or
    contradicting fields raise ``ValueError``. Returns the entry."""
    spec = EngineSpec(name, summary, **fields)
    spec.check()
    taken = {f.kind: e.name for e in ENGINES.values() if e.name != name for f in _forms_of(e)}
    for form in _forms_of(spec):
        if form.kind in taken:
            raise ValueError(f"register_engine({name!r}): --model kind {form.kind!r} belongs to {taken[form.kind]!r}")
    return ENGINES.add(name, spec)


def engines() -> list[EngineSpec]:
    """Every registered engine, in registration order."""
    return ENGINES.values()


def engine_spec(name: str) -> EngineSpec:
    """The entry of ``name``; an unknown name raises ``ValueError`` listing the registered ones."""
    return ENGINES.get(name)


def trainable_engines() -> list[str]:
    """Names a training run's ``rollout.engine`` may take."""
    return [e.name for e in ENGINES.values() if e.placement is not None]


def make_demonstrator(name: str, tokenizer: Any, tasks: list[dict[str, Any]]) -> Engine:
    """The demonstrator ``name`` for ``tasks`` (the records its episodes will play); a name that is no
    demonstrator raises ``ValueError`` listing those that are."""
    known = [e.name for e in ENGINES.values() if e.demonstrator is not None]
    make = ENGINES.get(name).demonstrator if name in ENGINES else None
    if make is None:
        raise ValueError(unknown_name("demonstrator", name, known))
    return make(tokenizer, tasks)


# ---- --model specs ---------------------------------------------------------------------------------------------
def spec_forms() -> list[SpecForm]:
    """Every ``--model`` form, in registration order."""
    return [f for e in ENGINES.values() for f in _forms_of(e)]


def _forms_of(entry: EngineSpec) -> list[SpecForm]:
    """``entry``'s ``--model`` forms; a demonstrator without a form of its own name gets the bare one, so every
    demonstrator a ``collect`` stage can use is reachable from ``sao collect --model NAME`` too."""
    forms = list(entry.specs)
    if entry.demonstrator is not None and not any(f.kind == entry.name for f in forms):
        forms.append(_demonstrator_form(entry.name, entry.demonstrator))
    return forms


def _demonstrator_form(name: str, make: Callable[[Any, list[dict[str, Any]]], Engine]) -> SpecForm:
    """``--model NAME`` for a demonstrator: its tokenizer from ``--tokenizer`` (default ``smollm2``), built for the
    task records the episodes will play (``SpecOptions.tasks``)."""

    async def build(spec: ModelSpec, o: SpecOptions) -> SpecModel:
        from sao.core.paths import resolve_model_path

        tokenizer = load_tokenizer(o.tokenizer or resolve_model_path("smollm2"))
        try:
            return SpecModel(engine=make(tokenizer, list(o.tasks)), tokenizer=tokenizer)
        except ValueError as e:
            raise ModelSpecError(f"--model {name}: {e}") from e

    return SpecForm(name, name, lambda text, target: ModelSpec(name), build, bare=True)


def spec_help() -> str:
    """The accepted ``--model`` forms, as help and errors show them."""
    out: list[str] = []
    for f in spec_forms():
        out.append(f.usage)
        if f.takes_alias:
            out.append("smollm2")
    return " | ".join(out)


def parse_model_spec(text: str) -> ModelSpec:
    """Parse ``--model``; an unknown or malformed spec raises ``ModelSpecError`` listing the accepted forms."""
    from sao.core.paths import MODEL_ALIASES

    forms = {f.kind: f for f in spec_forms()}
    word = text.strip()
    if word in forms and forms[word].bare:
        return forms[word].parse(text, "")
    kind, sep, rest = text.partition(":")
    rest = rest.strip()
    alias = next((f for f in forms.values() if f.takes_alias), None)
    if not sep and word.lower() in MODEL_ALIASES and alias is not None:
        return alias.parse(text, word)
    if not sep or not rest:
        raise ModelSpecError(f"--model {text!r}: expected KIND:TARGET, one of {spec_help()}")
    form = forms.get(kind)
    if form is None or form.bare:
        raise ModelSpecError(f"--model {text!r}: unknown model kind {kind!r}; use one of {spec_help()}")
    return form.parse(text, rest)


async def build_spec_model(spec: ModelSpec, options: SpecOptions) -> SpecModel:
    """Make the model ``spec`` names (a ``parse_model_spec`` result)."""
    form = next((f for f in spec_forms() if f.kind == spec.kind), None)
    if form is None:
        raise ModelSpecError(f"model kind {spec.kind!r} is not registered; use one of {spec_help()}")
    return await form.build(spec, options)


def load_tokenizer(source: str) -> Any:
    """The tokenizer of a model directory or alias (``smollm2``); a failure names ``--tokenizer`` as the fix."""
    from transformers import AutoTokenizer

    from sao.core.paths import resolve_model_path

    path = resolve_model_path(source)
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as e:
        where = source if path == source else f"{source} ({path})"
        raise ModelSpecError(
            f"cannot load the tokenizer from {where!r} ({type(e).__name__}: {e}); pass --tokenizer DIR "
            "(the served model's directory)"
        ) from e
