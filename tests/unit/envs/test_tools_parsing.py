"""parse_action: tool-call blocks, fenced code, and the FormatError messages the model sees."""

from __future__ import annotations

import pytest

from sao.envs.protocols import FormatError, ToolCall
from sao.envs.tools.parsing import parse_action

FENCED = {"python": ("python", "code")}


def test_tool_call_block() -> None:
    text = 'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
    assert parse_action(text) == ToolCall("bash", {"command": "ls -la"})


def test_arguments_as_json_string_and_first_block_wins() -> None:
    text = (
        '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call>'
        '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'
    )
    assert parse_action(text) == ToolCall("python", {"code": "print(1)"})


def test_unclosed_block_still_parses() -> None:
    assert parse_action('<tool_call>{"name": "submit"}') == ToolCall("submit", {})


def test_fenced_python_block_only_when_allowed() -> None:
    text = "Compute:\n```python\nx = 2**10\nprint(x)\n```\n"
    assert parse_action(text, fenced=FENCED) == ToolCall("python", {"code": "x = 2**10\nprint(x)\n"})
    with pytest.raises(FormatError, match="No tool call"):
        parse_action(text)


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ("just words", "No tool call"),
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', '"name"'),
        ('<tool_call>{"name": "bash", "arguments": [1]}</tool_call>', "JSON object"),
        ('<tool_call>{"name": "bash", "arguments": "{oops"}</tool_call>', "not JSON"),
    ],
)
def test_format_errors_explain_the_format(text: str, msg: str) -> None:
    with pytest.raises(FormatError, match=msg) as ei:
        parse_action(text)
    assert "<tool_call>" in str(ei.value)
