"""The harness registry: ``register_harness(name, ...)``; every choice of what plays an episode is looked up here.

``agent.harness`` (training and staged runs), ``--agent`` (``sao eval swebench``, ``sao collect``) name entries of
this registry, shaped like the engine registry (``sao.agent.engines.registry``). An entry (``HarnessSpec``) says:

* ``make``: ``config -> Harness`` (``sao.agent.harness.protocols``), the harness for one of its configs; None for
  ``sao``, SAO's own episode loop (``TokenPlayer`` on a token engine, ``ChatPlayer`` on a chat model);
* ``default_config``: the config used when none is named (mini-swe-agent: ``swebench_backticks``);
* ``env_ids``: the envs it can play (empty: any), checked before anything runs;
* ``aliases``: other spellings the command line accepts (``mini-swe-agent``).

``make_player(name, args)`` is the one place a ``Player`` for the episode runner is made from what a model spec
or a run built (``PlayerArgs``). The shipped harnesses (``sao``, ``mini_swe_agent``) register at the end of this
module; one from outside the package is a module that calls ``register_harness`` (docs/register_harness.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sao.agent.episodes import ChatPlayer, Player, TokenPlayer
from sao.agent.harness.protocols import Endpoint, Harness
from sao.agent.loop import AgentConfig
from sao.core.registry import Registry

DEFAULT_HARNESS = "sao"


@dataclass(frozen=True)
class HarnessSpec:
    """A registered harness (see the module doc for what each field decides)."""

    name: str
    summary: str
    make: Callable[[str], Harness] | None = None
    default_config: str = ""
    env_ids: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()

    @property
    def own_loop(self) -> bool:
        """SAO's own episode loop (no outside agent, no gateway)."""
        return self.make is None

    def check_env(self, env_id: str) -> None:
        """Refuse an env this harness cannot play (``ValueError`` naming the ones it can)."""
        if self.env_ids and env_id not in self.env_ids:
            raise ValueError(
                f"harness {self.name!r} plays {', '.join(self.env_ids)} episodes, not {env_id!r}; pick one of "
                f"those envs or another harness ({', '.join(harness_names())})"
            )


HARNESSES: Registry[HarnessSpec] = Registry("harness", describe=lambda spec: spec.summary)
_ALIASES: dict[str, str] = {}


def register_harness(name: str, summary: str, **fields: Any) -> HarnessSpec:
    """Register harness ``name`` (``fields``: those of ``HarnessSpec``); a taken name or alias raises
    ``ValueError``. Returns the entry."""
    spec = HarnessSpec(name, summary, **fields)
    clash = sorted(n for n in {name, *spec.aliases} if n in HARNESSES or n in _ALIASES)
    if clash:
        raise ValueError(f"register_harness({name!r}): {clash} already name a registered harness; pick another name")
    HARNESSES.add(name, spec)
    _ALIASES.update(dict.fromkeys(spec.aliases, name))
    return spec


def harnesses() -> list[HarnessSpec]:
    """Every registered harness, in registration order."""
    return HARNESSES.values()


def harness_names() -> list[str]:
    return HARNESSES.names()


def harness_spec(name: str) -> HarnessSpec:
    """The entry ``name`` (or one of its aliases) names; an unknown name raises ``ValueError`` listing them."""
    return HARNESSES.get(_ALIASES.get(name, name))


@dataclass(frozen=True)
class PlayerArgs:
    """What a player is made from: ``agent`` (episode limits and sampling; ``max_turns`` is an outside agent's step
    limit) and one of: a token ``engine`` with its ``tokenizer``; a ``chat`` model (SAO's own loop only); chat
    models ``per_task`` (a script, SAO's own loop only); an ``endpoint`` (an OpenAI-compatible one an outside agent
    calls directly, nothing recorded). ``config``: the harness's config (empty: its default);
    ``render_check_every``: SAO's own loop's render-drift check."""

    agent: AgentConfig = field(default_factory=AgentConfig)
    engine: Any = None
    tokenizer: Any = None
    chat: Any = None
    per_task: Callable[[str], Any] | None = None
    endpoint: Endpoint | None = None
    config: str = ""
    render_check_every: int = 0


def make_player(name: str, args: PlayerArgs) -> Player:
    """The player of harness ``name`` for what ``args`` holds; ``ValueError`` when the harness cannot use it."""
    spec = harness_spec(name)
    if spec.make is None:
        if args.engine is not None:
            return TokenPlayer(args.engine, args.tokenizer, args.agent, render_check_every=args.render_check_every)
        if args.chat is not None or args.per_task is not None:
            return ChatPlayer(args.chat, per_task=args.per_task, max_turns=args.agent.max_turns)
        raise ValueError(f"harness {spec.name!r} needs a token engine or a chat model")
    from sao.agent.harness.player import HarnessPlayer

    harness = spec.make(args.config or spec.default_config)
    if args.engine is not None:
        return HarnessPlayer(harness, args.agent, engine=args.engine, tokenizer=args.tokenizer)
    if args.endpoint is not None:
        return HarnessPlayer(harness, args.agent, endpoint=args.endpoint)
    raise ValueError(
        f"harness {spec.name!r} drives its own agent, which needs a token engine (played behind SAO's gateway, "
        "recorded) or an OpenAI-compatible endpoint (--model openai:MODEL@URL); a scripted chat cannot drive it"
    )


def describe_harness(name: str, config: str = "") -> dict[str, Any]:
    """Which agent and which of its configs: what a report records (``{"harness": "sao"}`` for the own loop)."""
    spec = harness_spec(name)
    if spec.make is None:
        return {"harness": spec.name}
    return spec.make(config or spec.default_config).describe()


# ---- the shipped harnesses -------------------------------------------------------------------------------------
def _mini_swe_agent(config: str) -> Harness:
    from sao.agent.harness.mini_swe_agent import MiniSweAgentHarness

    return MiniSweAgentHarness(config)


register_harness("sao", "SAO's own episode loop: the env's tools, token-in/token-out (the default)")
register_harness(
    "mini_swe_agent",
    "mini-swe-agent (the SWE-bench bash-only scaffold): its DefaultAgent and SWE-bench prompts, model calls "
    "through SAO's gateway, commands in the SWE env's sandbox",
    make=_mini_swe_agent,
    default_config="swebench_backticks",
    env_ids=("sao/SWE-v0",),
    aliases=("mini-swe-agent", "mini"),
)
