"""Helpers shared by the tools: schema building, argument checks, output capping."""

from __future__ import annotations

import shlex
import signal
from typing import Any

from sao.envs.base import cap_text
from sao.sandboxes.protocols import ExecResult

__all__ = ["ArgError", "cap_text", "command_output", "function_schema", "how_it_ended", "quote", "require"]

# What the kernel and the usual tools print when a write is refused for size (ulimit -f, a full tmpfs).
_REFUSED_WRITES = ("File size limit exceeded", "File too large", "No space left on device", "Disk quota exceeded")


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


def how_it_ended(res: ExecResult, timeout: float, explained_exit: int | None = None) -> str:
    """The line telling the model how its command ended (``""`` for a plain exit 0): the timeout, a kill for
    memory or for the disk limit, a signal, the exit code (unless it is ``explained_exit``, which the output
    already explains); and a note when a write was refused for its size. A model learns only from an ending it
    is told about."""
    if res.timed_out:
        return f"[the command timed out after {timeout:g} s and was killed]"
    if res.disk_full:
        return "[killed: the files written in the sandbox passed its disk limit; delete files (rm) before writing more]"
    if res.oom_killed:
        return f"[killed for memory (exit code {res.exit_code}): a process went past the sandbox's memory limit]"
    notes = []
    if 128 < res.exit_code <= 128 + 64:
        try:
            name = signal.Signals(res.exit_code - 128).name
        except ValueError:
            name = f"signal {res.exit_code - 128}"
        notes.append(f"[exit code {res.exit_code}: killed by {name}]")
    elif res.exit_code not in (0, explained_exit):
        notes.append(f"[exit code {res.exit_code}]")
    if any(m in res.output for m in _REFUSED_WRITES):
        notes.append("[a write was refused: a file or the sandbox's files reached the disk limit]")
    return "\n".join(notes)


def command_output(res: ExecResult, max_output: int, timeout: float, explained_exit: int | None = None) -> str:
    """What a command tool shows the model: the capped output, then how the command ended (``how_it_ended``)."""
    out = cap_text(res.output, max_output)
    ending = how_it_ended(res, timeout, explained_exit)
    if ending:
        out = f"{out.rstrip()}\n{ending}" if out.strip() else ending
    return out if out.strip() else "[no output]"
