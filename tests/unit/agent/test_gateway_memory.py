"""A gateway session's memory is linear in the episode's tokens (not one full prompt kept per call), and the checks
before a row grows can fail: a row out of step with the engine, a template that renders a message by its place
(issue 44, item 5)."""

from __future__ import annotations

import dataclasses
import gc
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from sao.agent.chat import ChatRenderer
from sao.agent.engines.scripted import ScriptedEngine
from sao.agent.gateway import GatewaySession, SessionLimits, parse_request

TASK = {"role": "user", "content": "Find the bug in a.py."}


@pytest.fixture(scope="module")
def tok(smollm2_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def act(tok: Any, text: str) -> list[int]:
    return [*tok.encode(text), 2]


async def _play(tok: Any, turns: int, observation: str) -> tuple[GatewaySession, int]:
    """A session of ``turns`` extending requests, each observation ``observation``; (session, its tokens)."""
    engine = ScriptedEngine([act(tok, "ls -la")])
    s = GatewaySession("s", engine, ChatRenderer(tok), SessionLimits(1 << 20, 16))
    msgs: list[dict[str, Any]] = [TASK]
    for _ in range(turns):
        reply = await s.complete(parse_request({"messages": msgs}, temperature=1.0, fixed_temperature=True))
        msgs = [*msgs, reply.as_message(), {"role": "user", "content": observation}]
    engine.prompts.clear()  # the scripted engine's own copies are not the session's
    return s, sum(len(seg.token_ids) for seg in s.record().rows[0])


async def test_a_200_turn_session_holds_its_tokens_once_not_a_prompt_per_call(tok: Any) -> None:
    observation = "x " * 150  # ~150 tokens a turn: 200 turns reach ~32k tokens
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        s, tokens = await _play(tok, 200, observation)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    rec = s.record()
    assert len(rec.rows) == 1 and rec.calls == 200 and rec.exactness_errors() == []
    assert 30_000 < tokens < 40_000
    # Quadratic (a prompt tuple per call, 8 bytes an id): 200 prompts averaging tokens / 2 ids ~ 26 MB here (the
    # previous EngineCall). Linear: the row's ids, the last prompt, the messages: a few MB at most.
    quadratic = 200 * (tokens // 2) * 8
    assert held < quadratic / 4, f"the session holds {held / 1e6:.1f} MB for {tokens} tokens"
    print(f"200-turn session, {tokens} tokens: {held / 1e6:.2f} MB held (a prompt per call: ~{quadratic / 1e6:.0f} MB)")


async def test_an_extension_whose_row_is_out_of_step_with_the_engine_starts_a_new_row(tok: Any) -> None:
    engine = ScriptedEngine([act(tok, "ls"), act(tok, "cat a.py"), act(tok, "done")])
    s = GatewaySession("s", engine, ChatRenderer(tok), SessionLimits(4096, 16))
    msgs: list[dict[str, Any]] = [TASK]
    for _ in range(2):
        reply = await s.complete(parse_request({"messages": msgs}, temperature=1.0, fixed_temperature=True))
        msgs = [*msgs, reply.as_message(), {"role": "user", "content": "a.py"}]
    assert s.prefix_breaks == 0 and len(s._rows) == 1
    # The row no longer ends with what the engine last saw (a bug that edited it, say): the next request extends
    # the messages, yet it must not extend this row.
    last = s._rows[-1][-1]
    s._rows[-1][-1] = dataclasses.replace(last, token_ids=(last.token_ids[0] + 1, *last.token_ids[1:]))
    await s.complete(parse_request({"messages": msgs}, temperature=1.0, fixed_temperature=True))
    assert s.prefix_breaks == 1 and len(s._rows) == 2
    assert tuple(engine.prompts[-1]) == s._rows[-1][0].token_ids and s._rows[-1][0].kind == "prompt"


async def test_a_template_that_renders_a_message_by_its_place_starts_a_new_row(smollm2_dir: Path) -> None:
    """The observation is rendered after a probe turn; a template that numbers user turns renders the third one
    differently in the conversation: the check sees it and starts a row from the whole rendering."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    tok.chat_template = (
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% if m['role'] == 'user' %}{% set ns.n = ns.n + 1 %}"
        "{{ '<|im_start|>user\\n[turn ' ~ ns.n ~ '] ' + m['content'] + '<|im_end|>\\n' }}{% else %}"
        "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    engine = ScriptedEngine([act(tok, "ls")])
    s = GatewaySession("s", engine, ChatRenderer(tok), SessionLimits(4096, 16))
    msgs: list[dict[str, Any]] = [TASK]
    for _ in range(3):
        reply = await s.complete(parse_request({"messages": msgs}, temperature=1.0, fixed_temperature=True))
        msgs = [*msgs, reply.as_message(), {"role": "user", "content": "a.py"}]
    # Call 2 extends (its new message is the 2nd user turn, as in the probe); call 3's is the 3rd: a new row, whose
    # prompt is the template's whole rendering, "[turn 3]" included.
    assert s.prefix_breaks == 1 and [len(r) for r in s._rows] == [4, 2]
    assert "[turn 3] a.py" in tok.decode(engine.prompts[-1])
