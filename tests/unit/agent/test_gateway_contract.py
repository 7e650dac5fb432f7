"""The gateway's HTTP contract against careless and hostile clients (issue 44), over a real uvicorn server with a
scripted engine and SmolLM2's tokenizer: malformed requests are 4xx naming the problem, sessions are private, a
close waits for its call in flight, a client that goes away trains nothing, ``stream: true`` and ``logprobs`` are
served, an outcome nobody gave is written as no reward."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from sao.agent.engines.scripted import ScriptedEngine
from sao.agent.gateway import CloseRequest, Gateway, SessionRecord
from sao.agent.gateway.standalone import TrajectorySink
from sao.agent.records import read_jsonl

openai = pytest.importorskip("openai", reason="the openai client comes with the dev extras (pip install -e .[dev])")

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
TASK = {"role": "user", "content": "Fix a.py."}
CALL = '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'


@pytest.fixture(scope="module")
def tok(smollm2_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def act(tok: Any, text: str) -> list[int]:
    return [*tok.encode(text), 2]


def close_url(base_url: str) -> str:
    """A session's close route, from its base URL (``.../s/<key>/v1``)."""
    return base_url.removesuffix("/v1") + "/close"


def gateway(
    tok: Any, engine: Any, closed: list[tuple[SessionRecord, CloseRequest]] | None = None, **kw: Any
) -> Gateway:
    sink = (lambda rec, req: closed.append((rec, req))) if closed is not None else None
    return Gateway(engine, tok, max_context_tokens=kw.pop("context", 512), max_action_tokens=32, on_close=sink, **kw)


async def test_malformed_bodies_are_400s_naming_the_problem_never_500s(tok: Any) -> None:
    async with gateway(tok, ScriptedEngine([act(tok, "ok")])) as gw:
        base = gw.open_session("ep")
        bad = {
            b'{"messages": [{"role": "user", "content": "\\ud800"}]}': "surrogate",
            b'{"messages": [{"role": "assistant", "tool_calls": 5}, {"role": "user", "content": "x"}]}': "tool_calls",
            b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}': "NaN",
            b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1e999}': "finite",
            b'{"messages": [{"role": "user", "content": "x"}], "tools": [5]}': "tools",
            b'{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}': "stream",
            b"\xff\xfe": "not JSON",
            b"": "empty",
        }
        async with httpx.AsyncClient() as h:
            for raw, named in bad.items():
                r = await h.post(f"{base}/chat/completions", content=raw, headers={"content-type": "application/json"})
                assert r.status_code == 400 and named in r.json()["error"]["message"], (raw, r.text)
    assert gw.engine.prompts == []  # type: ignore[attr-defined]


async def test_sessions_are_private_keys_and_no_error_lists_another(tok: Any) -> None:
    async with gateway(tok, ScriptedEngine([act(tok, "ok")])) as gw:
        mine, theirs = gw.open_session("mine"), gw.open_session("theirs")
        key = gw.session_key("theirs")
        assert len(key) >= 32 and key not in mine and "theirs" not in theirs
        async with httpx.AsyncClient() as h:
            for guess in ("theirs", "mine", "ep0-1", key[:-1]):
                r = await h.post(f"{gw.url}/s/{guess}/v1/chat/completions", json={"messages": [TASK]})
                by_key = await h.post(
                    f"{gw.url}/v1/chat/completions",
                    json={"messages": [TASK]},
                    headers={"Authorization": f"Bearer {guess}"},
                )
                for resp in (r, by_key):
                    assert resp.status_code == 404 and "theirs" not in resp.text and key not in resp.text
                    assert gw.session_key("mine") not in resp.text
        assert sorted(gw.open_sessions) == ["mine", "theirs"]  # a refused request opens nothing
        with pytest.raises(KeyError) as e:
            gw.close_session("nobody")
        assert "mine" not in str(e.value) and "theirs" not in str(e.value)
        record = gw.close_session("theirs")
        assert record.calls == 0
        async with httpx.AsyncClient() as h:  # an ended key is gone for good, and so is its id
            r = await h.post(f"{gw.url}/s/{key}/v1/chat/completions", json={"messages": [TASK]})
        assert r.status_code == 410 and "ended" in r.json()["error"]["message"]
        with pytest.raises(ValueError, match="used once"):
            gw.open_session("theirs")


async def test_a_malformed_close_is_refused_and_loses_nothing(tok: Any) -> None:
    closed: list[tuple[SessionRecord, CloseRequest]] = []
    async with gateway(tok, ScriptedEngine([act(tok, "ok")]), closed) as gw:
        base = gw.open_session("ep")
        close = close_url(base)
        async with httpx.AsyncClient() as h:
            assert (await h.post(f"{base}/chat/completions", json={"messages": [TASK]})).status_code == 200
            for raw in (b'{"reward": 1.0', b'{"reward": NaN}', b'{"reward": Infinity}', b'{"reward": 1e999}', b"[1]"):
                r = await h.post(close, content=raw)
                assert r.status_code == 400 and "still open" in r.json()["error"]["message"], (raw, r.text)
            assert gw.open_sessions == ["ep"] and closed == []
            ok = await h.post(close, json={"reward": 1.0, "task_id": "t"})
        assert ok.status_code == 200 and ok.json()["rows"] == 1
        ((record, req),) = closed
        assert req.reward == 1.0 and record.calls == 1


async def test_a_close_waits_for_the_call_in_flight(tok: Any) -> None:
    closed: list[tuple[SessionRecord, CloseRequest]] = []
    engine = ScriptedEngine([act(tok, "done")], delay_s=0.8)
    async with gateway(tok, engine, closed) as gw:
        base = gw.open_session("ep")
        async with httpx.AsyncClient(timeout=30) as h:
            chat = asyncio.create_task(h.post(f"{base}/chat/completions", json={"messages": [TASK]}))
            while not engine.prompts:
                await asyncio.sleep(0.01)
            close = await h.post(close_url(base), json={"reward": 1.0})
            reply = await chat
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "done"
    assert close.status_code == 200 and close.json()["rows"] == 1
    ((record, _),) = closed
    assert len(record.rows) == 1 and record.exactness_errors() == []


async def test_closing_by_the_opener_mid_call_discards_the_unseen_action(tok: Any) -> None:
    engine = ScriptedEngine([act(tok, "done")], delay_s=0.5)
    async with gateway(tok, engine) as gw:
        base = gw.open_session("ep")
        async with httpx.AsyncClient(timeout=30) as h:
            chat = asyncio.create_task(h.post(f"{base}/chat/completions", json={"messages": [TASK]}))
            while not engine.prompts:
                await asyncio.sleep(0.01)
            record = gw.close_session("ep")
            reply = await chat
    assert record.rows == () and reply.status_code == 410 and record.discarded == 1


async def test_a_client_that_goes_away_trains_nothing_and_its_retry_is_the_first_call(tok: Any) -> None:
    engine = ScriptedEngine([act(tok, "slow"), act(tok, "fast")], delay_s=1.0)
    async with gateway(tok, engine) as gw:
        base = gw.open_session("ep")
        async with httpx.AsyncClient(timeout=0.3) as h:
            with pytest.raises(httpx.ReadTimeout):
                await h.post(f"{base}/chat/completions", json={"messages": [TASK]})
        await asyncio.sleep(1.5)  # past the engine's delay: a call that was not cancelled would have been recorded
        assert gw.record("ep").rows == () and gw.record("ep").discarded == 1
        async with httpx.AsyncClient(timeout=30) as h:
            retry = await h.post(f"{base}/chat/completions", json={"messages": [TASK]})
        assert retry.status_code == 200
        record = gw.close_session("ep")
    assert len(record.rows) == 1 and record.prefix_breaks == 0 and record.exactness_errors() == []


async def test_stream_true_is_served_as_chunks_of_the_recorded_action_tool_calls_included(tok: Any) -> None:
    engine = ScriptedEngine([act(tok, "Look.\n" + CALL), act(tok, "Done.")])
    async with gateway(tok, engine) as gw:
        client = openai.AsyncOpenAI(base_url=gw.open_session("ep"), api_key="unused", max_retries=0)
        msgs: list[dict[str, Any]] = [TASK]
        stream = await client.chat.completions.create(
            model="m",
            messages=msgs,
            tools=TOOLS,
            stream=True,
            stream_options={"include_usage": True},  # type: ignore[arg-type]
        )
        content, calls, finish, usage = "", [], None, None
        async for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                content += choice.delta.content or ""
                calls += choice.delta.tool_calls or []
                finish = choice.finish_reason or finish
        assert content == "Look." and finish == "tool_calls" and usage is not None
        (call,) = calls
        assert call.function.name == "bash" and json.loads(call.function.arguments) == {"command": "ls"}  # type: ignore[union-attr, arg-type]
        assert usage.completion_tokens == len(act(tok, "Look.\n" + CALL))
        msgs += [
            {"role": "assistant", "content": content, "tool_calls": [call.model_dump(exclude={"index"})]},
            {"role": "tool", "tool_call_id": call.id, "content": "a.py"},
        ]
        second = await client.chat.completions.create(model="m", messages=msgs, tools=TOOLS, stream=True)  # type: ignore[arg-type]
        text = "".join([c.choices[0].delta.content or "" async for c in second if c.choices])
        assert text == "Done."
        await client.close()
        record = gw.close_session("ep")
    # The streaming agent's episode is one exact row, like any other.
    assert len(record.rows) == 1 and record.prefix_breaks == 0 and record.exactness_errors() == []


async def test_logprobs_true_is_served_with_the_engines_logprobs(tok: Any) -> None:
    ids = act(tok, "Hello there")
    async with gateway(tok, ScriptedEngine([ids], logprob=-0.25)) as gw:
        client = openai.AsyncOpenAI(base_url=gw.open_session("ep"), api_key="unused", max_retries=0)
        r = await client.chat.completions.create(model="m", messages=[TASK], logprobs=True)  # type: ignore[list-item]
        await client.close()
    lp = r.choices[0].logprobs
    assert lp is not None and lp.content is not None
    assert [t.logprob for t in lp.content] == [-0.25] * len(ids)
    assert "".join(t.token for t in lp.content[:-1]) == "Hello there"


async def test_no_outcome_is_no_reward_and_an_exhausted_context_is_a_truncation(tok: Any, tmp_path: Path) -> None:
    sink = TrajectorySink(tmp_path, echo=lambda _: None)
    engine = ScriptedEngine([act(tok, "word " * 20)])
    async with Gateway(engine, tok, max_context_tokens=48, max_action_tokens=40, on_close=sink.closed) as gw:
        bases = {sid: gw.open_session(sid) for sid in ("silent", "cut")}
        for base in bases.values():
            client = openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0)
            r = await client.chat.completions.create(model="m", messages=[TASK])  # type: ignore[list-item]
            assert r.choices[0].finish_reason == "length"
            await client.close()
        async with httpx.AsyncClient() as h:
            assert (await h.post(close_url(bases["silent"]), content=b"")).status_code == 200
            cut = await h.post(close_url(bases["cut"]), json={"reward": 1.0, "task_id": "cut"})
            assert cut.status_code == 200
    lines = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    by_session = {x["info"]["session_id"]: x for x in lines}
    silent = by_session["silent"]
    assert silent["status"] == "infra_error" and silent["reward"] is None
    assert all(s["reward"] is None for s in silent["segments"])
    cut_row = by_session["cut"]
    assert cut_row["status"] == "truncated" and cut_row["reward"] == 1.0
    assert cut_row["info"]["truncation_reason"] == "context_length" and cut_row["info"]["graded"] is True
    read = {t.info["session_id"]: t for t in read_jsonl(tmp_path / "trajectories.jsonl")}
    assert read["silent"].status == "infra_error" and not read["cut"].bootstraps
