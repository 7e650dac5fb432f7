"""Name -> entry registries: training algorithms, advantage estimators and policy losses.

``trainer.algorithm`` names an ``AlgorithmSpec``; the spec names its advantage estimator and policy loss and
declares everything else the trainer branches on (critic, old-policy recompute, grouping, synchronous rollouts,
staleness, config checks). Config validation, the learner and the run read the spec, never the name.
Every entry of a function registry is called the same way:

* advantage estimators: ``fn(inputs: AdvantageInputs) -> (advantages, returns)``, both ``[B, T]`` float tensors,
  zero off the action tokens;
* policy losses: ``fn(inputs: PolicyLossInputs) -> (loss, metrics)``, ``loss`` a scalar tensor that carries the
  gradient, ``metrics`` a dict of detached 0-dim tensors (call ``float()`` on them to log).

The tables, the entries' inputs and traits, ``AlgorithmSpec`` and the ``register_*`` decorators live one layer
down in ``sao.trainer.algos.tables`` (the built-in entries import them from there) and are exported here too; the
lookups below import the built-in entries first, so every lookup sees them.

This module imports no torch at run time, so reading a config stays cheap.
"""

from __future__ import annotations

from sao.trainer.algos.tables import (
    ADVANTAGE_TRAITS,
    ADVANTAGES,
    ALGORITHMS,
    POLICY_LOSS_TRAITS,
    POLICY_LOSSES,
    AdvantageFn,
    AdvantageInputs,
    AdvantageTraits,
    AlgorithmSpec,
    PolicyLossFn,
    PolicyLossInputs,
    PolicyLossTraits,
    Registry,
    register_advantage,
    register_policy_loss,
)


def _load_builtins() -> None:
    # The built-in entries register themselves on import; importing here lets a lookup work without the
    # caller having imported the modules first.
    import sao.trainer.algos.advantages
    import sao.trainer.algos.losses  # noqa: F401


def get_advantage(name: str) -> AdvantageFn:
    _load_builtins()
    return ADVANTAGES.get(name)


def get_policy_loss(name: str) -> PolicyLossFn:
    _load_builtins()
    return POLICY_LOSSES.get(name)


def advantage_names() -> list[str]:
    _load_builtins()
    return ADVANTAGES.names()


def advantage_traits(name: str) -> AdvantageTraits:
    get_advantage(name)
    return ADVANTAGE_TRAITS.get(name, AdvantageTraits())


def policy_loss_traits(name: str) -> PolicyLossTraits:
    get_policy_loss(name)
    return POLICY_LOSS_TRAITS.get(name, PolicyLossTraits())


def policy_loss_names() -> list[str]:
    _load_builtins()
    return POLICY_LOSSES.names()


def register_algorithm(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Add ``spec`` under ``spec.name``; ``trainer.algorithm: <name>`` then selects it.

    See docs/register_algorithm.md for a complete example (a new loss plus its spec, from outside the package).
    """
    _load_algorithms()
    return ALGORITHMS.add(spec.name, spec)


def _load_algorithms() -> None:
    import sao.trainer.algos.algorithms  # noqa: F401 - the built-in specs register themselves (no torch import)


def get_algorithm(name: str) -> AlgorithmSpec:
    _load_algorithms()
    return ALGORITHMS.get(name)


def algorithm_names() -> list[str]:
    _load_algorithms()
    return ALGORITHMS.names()


__all__ = [
    "ADVANTAGES",
    "ADVANTAGE_TRAITS",
    "ALGORITHMS",
    "POLICY_LOSSES",
    "POLICY_LOSS_TRAITS",
    "AdvantageFn",
    "AdvantageInputs",
    "AdvantageTraits",
    "AlgorithmSpec",
    "PolicyLossFn",
    "PolicyLossInputs",
    "PolicyLossTraits",
    "Registry",
    "advantage_names",
    "advantage_traits",
    "algorithm_names",
    "get_advantage",
    "get_algorithm",
    "get_policy_loss",
    "policy_loss_names",
    "policy_loss_traits",
    "register_advantage",
    "register_algorithm",
    "register_policy_loss",
]
