"""Helpers shared by the tools: schema building, argument checks, output capping."""

from __future__ import annotations

import shlex
from typing import Any

from envs.base import cap_text

__all__ = ["ArgError", "cap_text", "function_schema", "quote", "require"]


class ArgError(ValueError):
    """A tool argument is missing or has the wrong type; the message is shown to the model."""


def function_schema(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An OpenAI-style function schema."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def require(arguments: dict[str, Any], key: str, kind: type | tuple[type, ...], tool: str) -> Any:
    """``arguments[key]`` checked against ``kind``; ``ArgError`` naming the argument otherwise."""
    if key not in arguments:
        raise ArgError(f"{tool}: missing required argument {key!r}.")
    value = arguments[key]
    if kind is int and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        want = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ArgError(f"{tool}: argument {key!r} must be {want}, got {type(value).__name__}.")
    return value


def quote(s: str) -> str:
    return shlex.quote(s)
