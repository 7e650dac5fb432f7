"""The gateway over HTTP with the real ``openai`` client (scripted engine, SmolLM2's tokenizer): session in the URL or
in the API key, function-calling replies, 400s that name the setting, truncation as a 200, close over HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from sao.agent.engines.scripted import ScriptedEngine
from sao.agent.gateway import CloseRequest, Gateway, SessionRecord

openai = pytest.importorskip("openai", reason="the openai client comes with the dev extras (pip install -e .[dev])")

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
TASK = {"role": "user", "content": "Fix a.py."}


@pytest.fixture(scope="module")
def tok(smollm2_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def act(tok: Any, text: str) -> list[int]:
    return [*tok.encode(text), 2]


async def test_an_openai_client_round_trip_with_tool_calls_is_one_exact_row(tok: Any) -> None:
    call = '<tool_call>{"name": "bash", "arguments": {"command": "cat a.py"}}</tool_call>'
    engine = ScriptedEngine([act(tok, call), act(tok, "Fixed.")], version=2)
    async with Gateway(engine, tok, max_context_tokens=1024, max_action_tokens=64) as gw:
        base = gw.open_session("ep-1")
        assert base == f"{gw.url}/s/{gw.session_key('ep-1')}/v1" and "ep-1" not in base
        client = openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0)
        msgs: list[dict[str, Any]] = [TASK]
        r1 = await client.chat.completions.create(model="sao-policy", messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
        choice = r1.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        tc = choice.message.tool_calls[0]  # type: ignore[index]
        assert tc.function.name == "bash" and json.loads(tc.function.arguments) == {"command": "cat a.py"}  # type: ignore[union-attr]
        assert r1.usage is not None and r1.usage.completion_tokens == len(act(tok, call))
        msgs += [choice.message.model_dump(), {"role": "tool", "tool_call_id": tc.id, "content": "x = 1"}]
        r2 = await client.chat.completions.create(model="sao-policy", messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
        assert r2.choices[0].message.content == "Fixed." and r2.choices[0].finish_reason == "stop"
        models = await client.models.list()
        assert [m.id for m in models.data] == ["sao-policy"]
        await client.close()
        rec = gw.close_session("ep-1")
    assert rec.prefix_breaks == 0 and len(rec.rows) == 1 and rec.calls == 2 and rec.exactness_errors() == []
    ids = [t for s in rec.rows[0] for t in s.token_ids]
    assert ids == engine.prompts[1] + act(tok, "Fixed.") and rec.rows[0][-1].policy_version == 2


async def test_the_api_key_names_the_session_and_errors_are_clear(tok: Any) -> None:
    engine = ScriptedEngine([act(tok, "ok")])
    async with Gateway(engine, tok, max_context_tokens=64, max_action_tokens=8) as gw:
        gw.open_session("k1")
        client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=gw.session_key("k1"), max_retries=0)
        r = await client.chat.completions.create(model="any", messages=[TASK])  # type: ignore[list-item]
        assert r.choices[0].message.content == "ok"
        with pytest.raises(openai.BadRequestError, match="top_p"):
            await client.chat.completions.create(model="any", messages=[TASK], top_p=0.5)  # type: ignore[list-item]
        with pytest.raises(openai.BadRequestError, match="top_logprobs"):
            await client.chat.completions.create(model="any", messages=[TASK], logprobs=True, top_logprobs=2)  # type: ignore[list-item]
        # Past the context budget: a 200 with finish_reason "length", never a server error.
        long = {"role": "user", "content": "word " * 100}
        r = await client.chat.completions.create(model="any", messages=[long])  # type: ignore[list-item]
        assert r.choices[0].finish_reason == "length" and r.choices[0].message.content == ""
        stranger = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="k1", max_retries=0)  # the id is no key
        with pytest.raises(openai.NotFoundError, match="open_session"):
            await stranger.chat.completions.create(model="any", messages=[TASK])  # type: ignore[list-item]
        async with httpx.AsyncClient() as h:
            closed = await h.post(f"{gw.url}/s/{gw.session_key('k1')}/close", json={"reward": 1.0})
            no_key = await h.post(f"{gw.url}/v1/chat/completions", json={"messages": [TASK]})
        assert closed.status_code == 400 and "close_session" in closed.json()["error"]["message"]
        assert no_key.status_code == 401
        await client.close()
        await stranger.close()
        assert gw.record("k1").context_exhausted and gw.record("k1").calls == 2


async def test_a_user_process_opens_and_closes_over_http(tok: Any) -> None:
    closed: list[tuple[SessionRecord, CloseRequest]] = []
    engine = ScriptedEngine([act(tok, "ok")])
    gw = Gateway(
        engine, tok, max_context_tokens=256, max_action_tokens=8, open_over_http=True,
        on_close=lambda rec, req: closed.append((rec, req)),
    )  # fmt: skip
    await gw.start()
    try:
        async with httpx.AsyncClient(base_url=gw.url) as h:
            assert (await h.post("/s/mine/v1/chat/completions", json={"messages": [TASK]})).status_code == 404
            opened = (await h.post("/sessions", json={"session_id": "mine"})).json()
            assert opened["session_id"] == "mine" and opened["base_url"] == f"{gw.url}/s/{opened['api_key']}/v1"
            assert (await h.post("/sessions", json={"session_id": "mine"})).status_code == 400  # an id is used once
            key = opened["api_key"]
            r = await h.post(f"/s/{key}/v1/chat/completions", json={"messages": [TASK], "max_tokens": 4})
            assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] > 0
            bad = await h.post(f"/s/{key}/close", json={"reward": "high"})
            ok = await h.post(f"/s/{key}/close", json={"reward": 0.5, "task_id": "t9"})
            again = await h.post(f"/s/{key}/close", json={})
    finally:
        await gw.stop()
    assert bad.status_code == 400 and "reward" in bad.json()["error"]["message"]
    assert ok.status_code == 200 and ok.json()["rows"] == 1 and again.status_code == 410
    ((rec, req),) = closed
    assert rec.session_id == "mine" and req.reward == 0.5 and req.task_id == "t9" and gw.open_sessions == []


async def test_standalone_writes_closed_idle_and_leftover_sessions_never_as_a_fake_reward(
    tok: Any, tmp_path: Path
) -> None:
    import asyncio

    from sao.agent.gateway.standalone import StandaloneOptions, TrajectorySink, serve_gateway
    from sao.agent.records import read_jsonl

    lines: list[str] = []
    sink = TrajectorySink(tmp_path / "out", lines.append)
    engine = ScriptedEngine([act(tok, "ok")])
    gw = Gateway(engine, tok, max_context_tokens=256, max_action_tokens=8, open_over_http=True, on_close=sink.closed)
    task = asyncio.create_task(serve_gateway(gw, sink, StandaloneOptions(idle_s=1.5)))
    while not gw.serving:
        await asyncio.sleep(0.01)
    async with httpx.AsyncClient(base_url=gw.url) as h:
        keys = {}
        for sid in ("won", "idle", "left"):
            keys[sid] = (await h.post("/sessions", json={"session_id": sid})).json()["api_key"]
            assert (await h.post(f"/s/{keys[sid]}/v1/chat/completions", json={"messages": [TASK]})).status_code == 200
        assert (await h.post(f"/s/{keys['won']}/close", json={"reward": 1.0, "task_id": "t1"})).status_code == 200
        for _ in range(20):  # "left" keeps talking while "idle" goes idle
            await asyncio.sleep(0.2)
            await h.get("/health")
            await h.post(f"/s/{keys['left']}/v1/chat/completions", json={"messages": [TASK]})
        # An idle-closed session is gone for good: 410 naming why, never a second session under its key or id.
        late = await h.post(f"/s/{keys['idle']}/v1/chat/completions", json={"messages": [TASK]})
        assert late.status_code == 410 and "idle" in late.json()["error"]["message"]
        assert (await h.post("/sessions", json={"session_id": "idle"})).status_code == 400
    assert gw.open_sessions == ["left"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    by_task = {t.task_id: t for t in read_jsonl(tmp_path / "out" / "trajectories.jsonl")}
    assert by_task["t1"].status == "ok" and by_task["t1"].reward == 1.0 and by_task["t1"].info["session_id"] == "won"
    assert by_task["idle"].status == "infra_error" and "idle" in by_task["idle"].info["infra_error"]
    assert by_task["left"].status == "infra_error" and "stopped" in by_task["left"].info["infra_error"]
    assert by_task["left"].info["rows"] == by_task["left"].info["prefix_breaks"] + 1 > 1
    assert len(lines) == 3 and (tmp_path / "out" / "sessions.jsonl").read_text().count("\n") == 3


def test_sao_serve_gateway_refuses_an_evaluation_only_spec() -> None:
    from typer.testing import CliRunner

    from sao.cli.main import app

    res = CliRunner().invoke(app, ["serve", "--gateway", "openai:m@http://127.0.0.1:9/v1", "--max-tokens", "8"])
    assert res.exit_code == 2 and "evaluation-only" in res.output and "hf:DIR" in res.output, res.output
    res = CliRunner().invoke(app, ["serve", "--gateway", "smollm2", "--max-context", "64", "--max-tokens", "64"])
    assert res.exit_code == 2 and "--max-tokens" in res.output
