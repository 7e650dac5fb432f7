"""The demonstrator model specs of ``collect`` stages, by name: engines that play correct episodes from private
knowledge of the tasks (``solver``: arithmetic in the Python-tool env; ``swe_demonstrator``: SWE tasks).

``make_demonstrator(name, tokenizer, tasks)`` builds one; ``tasks`` are the records the episodes will play
(the SWE demonstrator reads their gold patches; the arithmetic solver reads the prompt alone).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.engines.protocols import Engine


def _solver(tokenizer: Any, tasks: list[dict[str, Any]]) -> Engine:
    from agent.engines.solver import SolverEngine

    return SolverEngine(tokenizer)


def _swe(tokenizer: Any, tasks: list[dict[str, Any]]) -> Engine:
    from agent.engines.swe_demonstrator import SWEDemonstratorEngine

    return SWEDemonstratorEngine(tokenizer, tasks)


DEMONSTRATORS: dict[str, Callable[[Any, list[dict[str, Any]]], Engine]] = {
    "solver": _solver,
    "swe_demonstrator": _swe,
}


def make_demonstrator(name: str, tokenizer: Any, tasks: list[dict[str, Any]]) -> Engine:
    """The demonstrator ``name`` for ``tasks``; an unknown name raises ``ValueError`` listing the known ones."""
    if name not in DEMONSTRATORS:
        raise ValueError(f"unknown demonstrator {name!r}; choose from {', '.join(DEMONSTRATORS)}")
    return DEMONSTRATORS[name](tokenizer, tasks)
