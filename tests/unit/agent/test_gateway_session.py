"""GatewaySession on SmolLM2's tokenizer with a scripted engine: rows equal the engine's record token for token,
edited / dropped history gives counted breaks, refused settings name themselves, the context budget truncates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sao.agent.chat import ChatRenderer
from sao.agent.engines.protocols import EngineError, Generation, SamplingParams
from sao.agent.engines.scripted import ScriptedEngine
from sao.agent.gateway import ChatRequest, GatewaySession, RequestError, SessionLimits, parse_request

SYSTEM = {"role": "system", "content": "You are a shell agent."}
TASK = {"role": "user", "content": "Find the bug in a.py."}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "bash", "description": "Run a command.", "parameters": {"type": "object"}},
    }
]


@pytest.fixture(scope="module")
def tok(smollm2_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


class RecordingEngine(ScriptedEngine):
    """A scripted engine that also keeps the sampling settings of every call."""

    def __init__(self, outputs: list[list[int]], **kw: Any) -> None:
        super().__init__(outputs, **kw)
        self.sampling: list[SamplingParams] = []

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        self.sampling.append(sampling)
        return await super().generate(prompt_ids, sampling)


def act(tok: Any, text: str) -> list[int]:
    return [*tok.encode(text), 2]  # 2 = <|im_end|>, the model's end of turn


def session(tok: Any, engine: Any, context: int = 2048, action: int = 256) -> GatewaySession:
    return GatewaySession("s1", engine, ChatRenderer(tok), SessionLimits(context, action))


def req(messages: list[dict[str, Any]], **body: Any) -> ChatRequest:
    return parse_request({"messages": messages, **body}, temperature=1.0, fixed_temperature=True)


def flat(row: tuple[Any, ...]) -> list[int]:
    return [t for s in row for t in s.token_ids]


async def test_three_extending_calls_make_one_row_equal_to_the_engines_record(tok: Any) -> None:
    # "ls" sampled as two tokens ("l", "s"): a re-tokenisation would give the one token 2971 instead.
    outputs = [[92, 99, 2], act(tok, "cat a.py"), act(tok, "submit")]
    engine = ScriptedEngine(outputs, logprob=-0.25, version=4)
    s = session(tok, engine)
    msgs = [SYSTEM, TASK]
    for obs in ("a.py", "print(1)", None):
        reply = await s.complete(req(msgs))
        msgs += [reply.as_message()] + ([{"role": "user", "content": obs}] if obs else [])
    rec = s.record()
    assert len(rec.rows) == 1 and rec.prefix_breaks == 0 and rec.calls == 3
    row = rec.rows[0]
    assert [x.kind for x in row] == ["prompt", "action", "observation", "action", "observation", "action"]
    ids = flat(row)
    # The engine's own record: every prompt it got is the row up to that action; each action is what it sampled.
    assert ids == engine.prompts[2] + outputs[2]
    for prompt, out in zip(engine.prompts, outputs, strict=True):
        assert ids[: len(prompt)] == prompt and ids[len(prompt) : len(prompt) + len(out)] == out
    assert row[1].token_ids == (92, 99, 2) and 2971 not in engine.prompts[1]
    assert all(a.policy_version == 4 and set(a.logprobs or ()) == {-0.25} for a in row[1::2])
    assert rec.exactness_errors() == []
    # ChatML is prefix-stable: the row is the template's rendering of the conversation but for the sampled ids.
    chat = ChatRenderer(tok)
    assert engine.prompts[0] == chat.render_prompt([SYSTEM, TASK])
    assert rec.messages[-1] == {"role": "assistant", "content": "submit"} and len(rec.messages) == len(msgs)


async def test_a_client_that_edits_history_gets_counted_breaks_and_exact_rows(tok: Any) -> None:
    outputs = [act(tok, "ls"), act(tok, "cat a.py"), act(tok, "submit")]
    engine = ScriptedEngine(outputs)
    s = session(tok, engine)
    r1 = await s.complete(req([SYSTEM, TASK]))
    # The harness summarises: the first user message is rewritten before the second call.
    edited = [SYSTEM, {"role": "user", "content": "Bug in a.py (summary)."}, r1.as_message()]
    edited.append({"role": "user", "content": "a.py"})
    r2 = await s.complete(req(edited))
    r3 = await s.complete(req([*edited, r2.as_message(), {"role": "user", "content": "x = 1"}]))
    rec = s.record()
    assert rec.prefix_breaks == 1 and len(rec.rows) == 2 and r3.content == "submit"
    assert [len(r) for r in rec.rows] == [2, 4]
    # Row 2 starts from a fresh rendering (its history is prompt, not trained on) and trains on what was sampled.
    assert flat(rec.rows[1][:1]) == engine.prompts[1] == ChatRenderer(tok).render_prompt(edited)
    assert flat(rec.rows[0]) == engine.prompts[0] + outputs[0]
    assert flat(rec.rows[1]) == engine.prompts[2] + outputs[2]
    assert rec.exactness_errors() == []


async def test_dropping_a_bad_assistant_message_or_changing_it_is_a_break(tok: Any) -> None:
    engine = ScriptedEngine([act(tok, "I think  "), act(tok, "ls"), act(tok, "ok")])
    s = session(tok, engine)
    r1 = await s.complete(req([SYSTEM, TASK]))
    # The harness drops the malformed reply and asks again with a format error message.
    await s.complete(req([SYSTEM, TASK, {"role": "user", "content": "Format error: call a tool."}]))
    assert s.record().prefix_breaks == 1
    r2 = s.record().messages[-1]
    # A harness that rewrites the assistant's text changed what the model wrote: a break too.
    changed = {"role": "assistant", "content": str(r2["content"]) + " "}
    await s.complete(req([SYSTEM, TASK, {"role": "user", "content": "Format error: call a tool."}, changed, TASK]))
    rec = s.record()
    assert rec.prefix_breaks == 2 and len(rec.rows) == 3 and r1.content == "I think  "
    assert rec.exactness_errors() == []


async def test_a_function_calling_round_trip_extends_without_a_break(tok: Any) -> None:
    call = '<tool_call>{"name": "bash", "arguments": {"command": "ls -a"}}</tool_call>'
    engine = ScriptedEngine([act(tok, "Looking.\n" + call), act(tok, "done")])
    s = session(tok, engine)
    r1 = await s.complete(req([SYSTEM, TASK], tools=TOOLS))
    assert r1.finish_reason == "tool_calls" and r1.content == "Looking."
    (tc,) = r1.tool_calls
    assert tc["function"]["name"] == "bash" and json.loads(tc["function"]["arguments"]) == {"command": "ls -a"}
    # The harness sends back what it got (arguments re-serialised, null content, extra fields) and two results.
    back = {
        "role": "assistant",
        "content": "Looking.",
        "refusal": None,
        "tool_calls": [
            {"id": tc["id"], "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls -a"}'}}
        ],
    }
    results = [
        {"role": "tool", "tool_call_id": tc["id"], "content": "a.py"},
        {"role": "tool", "tool_call_id": "other", "content": "b.py"},
    ]
    r2 = await s.complete(req([SYSTEM, TASK, back, *results], tools=TOOLS))
    rec = s.record()
    assert rec.prefix_breaks == 0 and len(rec.rows) == 1 and r2.finish_reason == "stop"
    obs = tok.decode(rec.rows[0][2].token_ids)
    # One observation segment: both results, each as its own message (SmolLM2 has no tool role: user).
    assert obs == "\n<|im_start|>user\na.py<|im_end|>\n<|im_start|>user\nb.py<|im_end|>\n<|im_start|>assistant\n"
    # The tool schemas sit in the system prompt (the template has no tools support), as the SFT renderer puts them.
    assert "# Tools" in tok.decode(engine.prompts[0]) and rec.exactness_errors() == []
    # Other tools in the next request: not an extension.
    await s.complete(req([SYSTEM, TASK, back, *results, r2.as_message(), TASK]))
    assert s.record().prefix_breaks == 1


async def test_a_malformed_tool_call_comes_back_as_text(tok: Any) -> None:
    text = '<tool_call>{"name": "bash", "arguments": {"command": }</tool_call>'
    s = session(tok, ScriptedEngine([act(tok, text)]))
    r = await s.complete(req([SYSTEM, TASK], tools=TOOLS))
    assert r.tool_calls == [] and r.content == text and r.finish_reason == "stop"


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("top_p", 0.9),
        ("top_k", 40),
        ("min_p", 0.05),
        ("presence_penalty", 0.5),
        ("frequency_penalty", 0.1),
        ("repetition_penalty", 1.1),
        ("logit_bias", {"50256": -100}),
        ("n", 2),
        ("min_tokens", 3),
        ("response_format", {"type": "json_object"}),
        ("tool_choice", "required"),
        ("temperature", 0.7),
        ("stream", "yes"),
        ("top_logprobs", 5),
        ("max_tokens", 0),
    ],
)
def test_a_refused_setting_names_itself(setting: str, value: Any) -> None:
    with pytest.raises(RequestError) as e:
        parse_request({"messages": [TASK], setting: value}, temperature=1.0, fixed_temperature=True)
    assert e.value.param == setting and setting in str(e.value)


def test_neutral_settings_pass() -> None:
    body = {
        "messages": [TASK],
        "top_p": 1.0,
        "top_k": -1,
        "presence_penalty": 0,
        "n": 1,
        "temperature": 1.0,
        "stream": False,
        "logprobs": True,
        "stop": "\n\n",
        "max_completion_tokens": 64,
        "max_tokens": 100,
    }
    r = parse_request(body, temperature=1.0, fixed_temperature=True)
    assert r.max_tokens == 64 and r.stop == ("\n\n",) and r.temperature == 1.0
    assert (
        parse_request({"messages": [TASK], "temperature": 0}, temperature=1.0, fixed_temperature=False).temperature == 0
    )


async def test_max_tokens_is_capped_by_the_session_budget(tok: Any) -> None:
    engine = RecordingEngine([act(tok, "ls")])
    s = session(tok, engine, context=2048, action=16)
    await s.complete(req([TASK], max_tokens=1000))
    await s.complete(req([TASK], max_tokens=5))
    assert [sp.max_tokens for sp in engine.sampling] == [16, 5]
    assert engine.sampling[0].stop_token_ids == (2,) and engine.sampling[0].temperature == 1.0


async def test_an_action_that_fills_the_context_ends_the_episode_as_a_truncation(tok: Any) -> None:
    prompt_len = len(ChatRenderer(tok).render_prompt([SYSTEM, TASK]))
    engine = RecordingEngine([act(tok, "one two three four five six seven eight")])
    s = session(tok, engine, context=prompt_len + 4, action=3)
    r = await s.complete(req([SYSTEM, TASK]))
    assert (r.finish_reason, r.completion_tokens) == ("length", 3) and s.context_exhausted is False
    # The next request's observation leaves no room: an empty "length" reply, nothing appended, no engine call.
    r2 = await s.complete(req([SYSTEM, TASK, r.as_message(), {"role": "user", "content": "go on"}]))
    assert (r2.content, r2.finish_reason) == ("", "length") and s.context_exhausted
    r3 = await s.complete(req([SYSTEM, TASK]))
    rec = s.record()
    assert r3.finish_reason == "length" and len(engine.prompts) == 1 and rec.calls == 3
    assert [x.kind for x in rec.rows[0]] == ["prompt", "action"] and rec.exactness_errors() == []


async def test_an_action_reaching_the_budget_is_kept_and_ends_the_episode(tok: Any) -> None:
    prompt_len = len(ChatRenderer(tok).render_prompt([TASK]))
    s = session(tok, ScriptedEngine([act(tok, "one two three four five six")]), context=prompt_len + 2, action=16)
    r = await s.complete(req([TASK]))
    assert r.finish_reason == "length" and r.completion_tokens == 2 and s.context_exhausted
    assert r.content == tok.decode(s.record().rows[0][1].token_ids)


async def test_a_first_prompt_past_the_budget_is_a_truncation_not_an_error(tok: Any) -> None:
    engine = ScriptedEngine([act(tok, "ls")])
    s = session(tok, engine, context=20, action=4)
    r = await s.complete(req([SYSTEM, {"role": "user", "content": "word " * 50}]))
    assert (r.content, r.finish_reason, r.completion_tokens) == ("", "length", 0) and r.prompt_tokens > 20
    assert s.context_exhausted and s.record().rows == () and engine.prompts == []


async def test_a_stop_string_cuts_the_action_after_the_token_that_completes_it(tok: Any) -> None:
    out = [*tok.encode("ls\nSTOP more"), 2]  # the scripted engine ignores stop strings: the session cuts
    s = session(tok, ScriptedEngine([out]))
    r = await s.complete(req([TASK], stop=["STOP"]))
    rec = s.record()
    assert r.content == "ls\n" and r.finish_reason == "stop"
    assert rec.rows[0][1].token_ids == tuple(tok.encode("ls\nSTOP")) and rec.engine_calls[0].kept == 3
    assert rec.exactness_errors() == []


async def test_an_engine_error_records_nothing_and_a_retry_extends(tok: Any) -> None:
    engine = ScriptedEngine([act(tok, "ls"), act(tok, "ok")], fail_after=1)
    s = session(tok, engine)
    r1 = await s.complete(req([TASK]))
    nxt = req([TASK, r1.as_message(), {"role": "user", "content": "a.py"}])
    with pytest.raises(EngineError):
        await s.complete(nxt)
    engine.fail_after = None
    await s.complete(nxt)
    rec = s.record()
    assert rec.engine_errors == 1 and rec.prefix_breaks == 0 and len(rec.rows) == 1 and len(rec.rows[0]) == 4


async def test_trajectories_share_the_outcome_and_the_check_catches_a_wrong_row(tok: Any) -> None:
    s = session(tok, ScriptedEngine([act(tok, "ls"), act(tok, "ok")]))
    await s.complete(req([TASK]))
    await s.complete(req([SYSTEM, TASK]))
    rec = s.record()
    trajs = rec.trajectories(task_id="t", env_id="sao/SWE-v0", reward=1.0, status="ok", info={"harness": "x"})
    assert [t.info["row"] for t in trajs] == [0, 1] and all(t.info["rows"] == 2 for t in trajs)
    assert all(t.reward == 1.0 and t.segments[-1].reward == 1.0 and t.info["prefix_breaks"] == 1 for t in trajs)
    assert trajs[0].info["session_id"] == "s1" and trajs[1].info["harness"] == "x"
    import dataclasses

    action = rec.rows[1][1]
    bad_action = dataclasses.replace(action, token_ids=(5, *action.token_ids[1:]))
    bad = dataclasses.replace(rec, rows=(rec.rows[0], (rec.rows[1][0], bad_action)))
    assert bad.exactness_errors() == ["row 1, action 1: ids or logprobs differ from what the engine sampled"]
