"""Hypothesis over request bodies and orders of calls (open, chat, retry, close, bad bodies) against the gateway's
HTTP contract (issue 44): never a 5xx, nothing recorded from a refused call, a reward only from a well-formed close
that gave one, no reply naming another session. A scripted engine in process; a real uvicorn server."""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sao.agent.engines.scripted import ScriptedEngine
from sao.agent.gateway import CloseRequest, Gateway, SessionRecord

TASK = {"role": "user", "content": "Fix a.py."}
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
STATUSES = {200, 400, 401, 404, 409, 410}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
FIELDS = ["messages", "tools", "tool_choice", "stream", "stream_options", "logprobs", "top_logprobs", "max_tokens",
          "max_completion_tokens", "temperature", "stop", "top_p", "n", "response_format", "logit_bias"]  # fmt: skip
NASTY = [
    b'{"messages": [{"role": "user", "content": "\\udfff"}]}',
    b'{"messages": [{"role": "assistant", "tool_calls": 5}, {"role": "user", "content": "x"}]}',
    b'{"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "bash", "arguments": "{"}}]}]}',
    b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
    b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
    b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1e400}',
    b'{"messages": [{"role": "tool", "content": "x"}], "tools": [{"type": "function"}]}',
    b'{"messages": "hi"}',
    b"\xc3\x28",
    b"[]",
]
chat_bodies = st.one_of(
    st.sampled_from(["extend", "extend", "restart", "stream"]),
    st.tuples(st.sampled_from(FIELDS), json_values),  # a valid extension with one field replaced
    st.sampled_from(NASTY),
    st.sampled_from(NASTY),
    json_values.map(lambda v: json.dumps(v).encode()),
)
close_bodies = st.one_of(
    st.floats(-10, 10).map(lambda r: json.dumps({"reward": r, "task_id": "t"}).encode()),
    st.just(b""),
    st.sampled_from([b'{"reward": NaN}', b'{"reward": -Infinity}', b'{"reward": 1e999}', b'{"reward": 1', b"\xff"]),
    st.dictionaries(st.sampled_from(["reward", "status", "info", "task_id", "env_id"]), json_values, max_size=4).map(
        lambda d: json.dumps(d).encode()
    ),
)
targets = st.one_of(st.integers(0, 3), st.sampled_from(["ended", "bogus", "id-as-key", "bearer"]))
chats = st.tuples(st.just("chat"), targets, chat_bodies)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("open"), st.booleans()),
        chats,
        chats,
        chats,
        st.tuples(st.just("retry"), targets),
        st.tuples(st.just("close"), targets, close_bodies),
        st.tuples(st.just("opener_close"), st.integers(0, 3)),
    ),
    min_size=3,
    max_size=16,
).map(lambda ops: [("open", True), *ops])  # a live session from the start: most bodies reach one


@pytest.fixture(scope="module")
def tok(smollm2_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


@dataclass
class Client:
    """One session as its client sees it: its key, id, messages so far and last body."""

    sid: str
    key: str
    messages: list[dict[str, Any]] = field(default_factory=lambda: [TASK])
    last: bytes = b""


@dataclass
class World:
    gw: Gateway
    http: httpx.AsyncClient
    clients: list[Client] = field(default_factory=list)
    ended: list[Client] = field(default_factory=list)
    closes: list[tuple[SessionRecord, CloseRequest]] = field(default_factory=list)
    refused_engine_calls: int = 0

    def pick(self, target: int | str) -> tuple[str, Client | None]:
        """(the URL path of the chat route's session part, the client if it is a live one)."""
        if isinstance(target, int):
            if not self.clients:
                return "/s/nokey", None
            c = self.clients[target % len(self.clients)]
            return f"/s/{c.key}", c
        if target == "ended" and self.ended:
            return f"/s/{self.ended[-1].key}", None
        if target == "id-as-key" and self.clients:
            return f"/s/{self.clients[-1].sid}", None
        return "/s/" + uuid.uuid4().hex, None

    def check(self, r: httpx.Response, own: Client | None) -> None:
        assert r.status_code in STATUSES, (r.status_code, r.text[:300])
        for c in self.clients + self.ended:
            if c is not own:
                assert c.key not in r.text and c.sid not in r.text, r.text[:300]
        if r.status_code >= 400:
            assert r.json()["error"]["message"], r.text


def _chat_body(c: Client | None, spec: Any) -> bytes:
    messages = c.messages if c is not None else [TASK]
    if isinstance(spec, bytes):
        return spec
    body: dict[str, Any] = {"messages": [TASK] if spec == "restart" else messages, "tools": TOOLS}
    if spec == "stream":
        body["stream"] = True
    if isinstance(spec, tuple):
        body[spec[0]] = spec[1]
    return json.dumps(body).encode()


async def _chat(w: World, target: int | str, spec: Any, retry: bool = False) -> None:
    path, c = w.pick(target)
    raw = c.last if retry and c is not None and c.last else _chat_body(c, spec)
    before = len(w.gw.engine.prompts)  # type: ignore[attr-defined]
    headers = {"content-type": "application/json"}
    if target == "bearer" and w.clients:
        url, headers["Authorization"] = "/v1/chat/completions", f"Bearer {w.clients[0].key}"
        c = w.clients[0]
    else:
        url = f"{path}/v1/chat/completions"
    r = await w.http.post(url, content=raw, headers=headers)
    w.check(r, c)
    if r.status_code != 200:
        assert len(w.gw.engine.prompts) == before, "a refused request reached the engine"  # type: ignore[attr-defined]
        return
    if c is None:
        return
    c.last = raw
    if r.headers["content-type"].startswith("text/event-stream"):
        events = [e for e in r.text.split("\n\n") if e]
        assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
        return
    message = r.json()["choices"][0]["message"]
    sent = json.loads(raw)["messages"]
    if isinstance(sent, list):
        c.messages = [*sent, message, {"role": "tool", "content": "out"}]


async def _close(w: World, target: int | str, raw: bytes) -> None:
    path, c = w.pick(target)
    r = await w.http.post(f"{path}/close", content=raw)
    w.check(r, c)
    if c is None:
        return
    if r.status_code == 200:
        w.clients.remove(c)
        w.ended.append(c)
        close = w.closes[-1][1]
        body = json.loads(raw) if raw.strip() else None
        given = body.get("reward") if isinstance(body, dict) else None
        assert close.reward == given and (given is None or math.isfinite(given))
    else:
        assert c.sid in w.gw.open_sessions, "a refused close closed the session"


async def _scenario(tok: Any, ops: list[tuple[Any, ...]]) -> World:
    outputs = [[*tok.encode("ok"), 2], [*tok.encode('<tool_call>{"name": "bash", "arguments": {}}</tool_call>'), 2]]
    closes: list[tuple[SessionRecord, CloseRequest]] = []
    gw = Gateway(ScriptedEngine(outputs), tok, max_context_tokens=400, max_action_tokens=24, open_over_http=True,
                 on_close=lambda rec, req: closes.append((rec, req)))  # fmt: skip
    async with gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
        w = World(gw, http, closes=closes)
        for op in ops:
            if op[0] == "open":
                label = f"fuzz-{uuid.uuid4().hex[:10]}" if op[1] else None
                r = await http.post("/sessions", json={"session_id": label} if label else None)
                assert r.status_code == 200, r.text
                w.clients.append(Client(r.json()["session_id"], r.json()["api_key"]))
            elif op[0] == "chat":
                await _chat(w, op[1], op[2])
            elif op[0] == "retry":
                await _chat(w, op[1], "extend", retry=True)
            elif op[0] == "close":
                await _close(w, op[1], op[2])
            elif w.clients:
                c = w.clients.pop(op[1] % len(w.clients))
                w.closes.append((gw.close_session(c.sid), CloseRequest()))
                w.ended.append(c)
        for c in list(w.clients):
            w.closes.append((gw.close_session(c.sid), CloseRequest()))
    return w


async def test_each_nasty_body_is_a_400_on_a_live_session(tok: Any) -> None:
    gw = Gateway(ScriptedEngine([[2]]), tok, max_context_tokens=400, max_action_tokens=24)
    async with gw, httpx.AsyncClient(timeout=30) as http:
        base = gw.open_session()
        for raw in NASTY:
            r = await http.post(f"{base}/chat/completions", content=raw)
            assert r.status_code == 400 and r.json()["error"]["message"], (raw, r.text)
    assert gw.engine.prompts == []  # type: ignore[attr-defined]


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
def test_the_http_contract_holds_for_any_bodies_in_any_order(tok: Any, ops: list[tuple[Any, ...]]) -> None:
    w = asyncio.run(_scenario(tok, ops))
    # What reached the engine is exactly what the records hold: every answered call recorded once, nothing else.
    actions = sum(1 for rec, _ in w.closes for row in rec.rows for seg in row if seg.kind == "action")
    assert actions == len(w.gw.engine.prompts)  # type: ignore[attr-defined]
    for rec, close in w.closes:
        assert rec.exactness_errors() == [] and rec.discarded == 0
        if close.reward is None:
            trajs = rec.trajectories(task_id="t", env_id="e", reward=None, status="infra_error", info={})
            assert all(t.to_dict()["reward"] is None for t in trajs)
