"""``parse_action``: the model's raw assistant text -> one ``ToolCall``, or ``FormatError`` saying what to write.

Accepted, in this order:
1. ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (the Hermes/Qwen/SmolLM2 function-calling form;
   ``arguments`` may also be a JSON string, as OpenAI emits). Only the first block is used: one action per turn.
2. A fenced code block whose language is a key of ``fenced`` (e.g. ```` ```python ```` -> ``("python", "code")``):
   the last such block becomes a call of that tool with the block's body as that argument.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sao.envs.protocols import FormatError, ToolCall

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)

FORMAT_HELP = (
    'Call a tool with <tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call> '
    "(one call per message, arguments as a JSON object)."
)


def parse_action(text: str, fenced: dict[str, tuple[str, str]] | None = None) -> ToolCall:
    """Parse one tool call out of ``text`` (formats in the module doc); raise ``FormatError`` otherwise."""
    m = _TOOL_CALL.search(text)
    if m is not None:
        return _parse_json_call(m.group(1))
    if fenced:
        blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text) if lang.lower() in fenced]
        if blocks:
            lang, body = blocks[-1]
            tool, arg = fenced[lang]
            return ToolCall(name=tool, arguments={arg: body})
    hint = ""
    if fenced:
        langs = ", ".join(f"```{k}" for k in sorted(fenced))
        hint = f" Or put code in a fenced block ({langs})."
    raise FormatError(f"No tool call found. {FORMAT_HELP}{hint}")


def _parse_json_call(body: str) -> ToolCall:
    try:
        obj: Any = json.loads(body)
    except json.JSONDecodeError as e:
        raise FormatError(f"The <tool_call> body is not valid JSON ({e.msg} at char {e.pos}). {FORMAT_HELP}") from e
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        raise FormatError(f'The <tool_call> JSON needs a "name" string. {FORMAT_HELP}')
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise FormatError(f'"arguments" is a string that is not JSON ({e.msg}). {FORMAT_HELP}') from e
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise FormatError(f'"arguments" must be a JSON object, got {type(args).__name__}. {FORMAT_HELP}')
    return ToolCall(name=obj["name"], arguments=args)
