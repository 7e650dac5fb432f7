"""One episode behind the gateway: OpenAI chat requests in, rows of token-exact segments out (no HTTP here).

The exactness rule. A request *extends* the session when its messages are the previous request's messages, then
the assistant message the gateway returned for it, then at least one new non-assistant message (compared in
normal form, ``wire.normal_message``), with the same tools. Then the new messages are rendered after the sampled
action ids (``ChatRenderer.render_after_action_messages``, one observation segment) and the engine gets exactly
``previous prompt ids + sampled ids + observation ids``: token-in, an earlier action is never re-tokenised.
Any other request (history edited or summarised, an assistant message changed or dropped, other tools) starts a
new *row* from ``render_prompt`` of its messages and counts a prefix break. Every row is prompt, action,
(observation, action)*: exactly the ids the engine was given and sampled, so each row trains on what the model
saw; all rows of an episode share its outcome. Before an extension goes to the engine, the row so far is checked
to be exactly the ids the engine was last given and sampled (kept apart from the row); a failed check starts a new
row instead, so a row out of step with the engine is never extended.

Memory: a session keeps each row's ids once (its segments), the last prompt, and per engine call its sampled ids
and logprobs with a digest of its prompt: linear in the episode's tokens, not quadratic in its turns.

The context budget: a prompt that leaves no room for one action token ends the episode (``context_exhausted``,
the reply is empty with ``finish_reason="length"``, its messages are not appended); an action that fills the
last room is kept (the reply carries its text, ``finish_reason="length"``) and ends the episode too. Later
requests get the same empty "length" reply without reaching the engine. Never an error.

Stop strings are honoured whatever the engine: the action is cut after the token that completes the first stop
string (vLLM stops there itself; an engine that does not gets its tail dropped). A prefix of sampled tokens is
still exactly what was sampled, and the next prompt carries the cut action, so the row stays exact.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sao.agent.chat import ChatRenderer
from sao.agent.engines.protocols import Engine, EngineError, SamplingParams
from sao.agent.gateway.replies import split_tool_calls
from sao.agent.gateway.wire import ChatRequest, normal_message, template_messages
from sao.agent.records import Segment, Trajectory


def ids_digest(ids: Sequence[int]) -> str:
    """A digest of a token id sequence (what ``EngineCall`` keeps of a prompt instead of the prompt itself)."""
    return hashlib.blake2b(array("q", ids).tobytes(), digest_size=16).hexdigest()


class SessionClosed(LookupError):
    """The session was closed (or is closing) while this request waited or ran: nothing of it is recorded."""


class ClientGone(Exception):
    """The client went away before its reply was sent: the sampled action is discarded, never recorded."""


@dataclass(frozen=True)
class EngineCall:
    """The engine's side of one request: the length and digest (``ids_digest``) of the exact prompt ids it got,
    the ids and logprobs it sampled, the version that sampled them, its finish reason, how many sampled tokens the
    row kept (fewer only when a stop string ended the action early) and the seconds the call took. Not the prompt
    itself: that would be quadratic in turns (a 200-turn 64k-token session held ~53 MB of prompts); the row holds
    the ids once, and ``SessionRecord.engine_prompts`` gives each prompt back from it."""

    prompt_len: int
    prompt_digest: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    version: int
    finish_reason: str
    kept: int
    engine_s: float


@dataclass(frozen=True)
class SessionRecord:
    """A closed (or peeked-at) session: its rows, breaks, calls, the last messages, and the engine's own record.

    ``rows``: each row is prompt, action, (observation, action)*, exactly what the engine saw. ``calls``: chat
    requests answered. ``messages``: the last request's messages + the last reply. ``engine_calls``: one per engine
    request, in order (``exactness_errors`` compares them with the rows). ``engine_errors``: requests the engine
    failed (answered 502; an episode with any is an infra error for the harness to mark). ``discarded``: actions
    sampled (or being sampled) for a client that went away or a session that was closed meanwhile: never
    recorded, since nobody saw them.
    """

    session_id: str
    rows: tuple[tuple[Segment, ...], ...]
    prefix_breaks: int
    calls: int
    context_exhausted: bool
    messages: tuple[dict[str, Any], ...]
    engine_calls: tuple[EngineCall, ...] = ()
    engine_errors: int = 0
    discarded: int = 0

    def trajectories(
        self, *, task_id: str, env_id: str, reward: float | None, status: str, info: dict[str, Any]
    ) -> list[Trajectory]:
        """One Trajectory per row, all with the episode's ``reward`` (on each row's last action segment) and
        ``status``; ``info`` gains row / rows / prefix_breaks / session_id / calls / context_exhausted /
        discarded. No outcome (``reward`` None or ``status="infra_error"``): no segment carries a reward and the
        rows are written with ``"reward": null``. No row (no request reached the engine): an empty list."""
        out = []
        engine_s = sum(c.engine_s for c in self.engine_calls)
        outcome = None if reward is None or status == "infra_error" else float(reward)
        if outcome is None and status != "infra_error":
            raise ValueError(f"status {status!r} without a reward: an episode with no outcome is an infra_error")
        for i, row in enumerate(self.rows):
            segments = list(row)
            last = max(j for j, s in enumerate(segments) if s.kind == "action")
            segments[last] = dataclasses.replace(segments[last], reward=outcome)
            row_info = {
                **info,
                "row": i,
                "rows": len(self.rows),
                "prefix_breaks": self.prefix_breaks,
                "session_id": self.session_id,
                "calls": self.calls,
                "context_exhausted": self.context_exhausted,
                "discarded": self.discarded,
            }
            timings = {"engine_s": engine_s} if i == 0 else {}
            traj = Trajectory(task_id, env_id, tuple(segments), outcome or 0.0, status, row_info, timings)  # type: ignore[arg-type]
            out.append(traj)
        return out

    def exactness_errors(self) -> list[str]:
        """Where the rows differ from the engine's record (empty: token for token the same). Action ``k`` of the
        episode (rows in order) must have been sampled by engine call ``k``, from exactly the row's ids before it."""
        steps: list[tuple[int, tuple[int, ...], Segment]] = []
        errors = []
        for r, row in enumerate(self.rows):
            kinds = [s.kind for s in row]
            if kinds[:1] != ["prompt"] or kinds[-1:] != ["action"] or any(k == "prompt" for k in kinds[1:]):
                errors.append(f"row {r}: segments {kinds} are not prompt, action, (observation, action)*")
            seen: list[int] = []
            for seg in row:
                if seg.kind == "action":
                    steps.append((r, tuple(seen), seg))
                seen += seg.token_ids
        if len(steps) != len(self.engine_calls):
            errors.append(f"{len(steps)} actions in the rows but {len(self.engine_calls)} engine calls")
        for k, ((r, before, seg), call) in enumerate(zip(steps, self.engine_calls, strict=False)):
            if len(before) != call.prompt_len or ids_digest(before) != call.prompt_digest:
                errors.append(f"row {r}, action {k}: the row's ids before it differ from the engine's prompt")
            if seg.token_ids != call.token_ids[: call.kept] or seg.logprobs != call.logprobs[: call.kept]:
                errors.append(f"row {r}, action {k}: ids or logprobs differ from what the engine sampled")
            if seg.policy_version != call.version:
                errors.append(f"row {r}, action {k}: version {seg.policy_version}, the engine's {call.version}")
        return errors

    def engine_prompts(self) -> Iterator[list[int]]:
        """The prompt of each engine call in order, from the rows (``exactness_errors`` checks they are the very
        ids the engine got), one at a time."""
        for row in self.rows:
            seen: list[int] = []
            for seg in row:
                if seg.kind == "action":
                    yield list(seen)
                seen += seg.token_ids


@dataclass(frozen=True)
class SessionLimits:
    """``max_context_tokens``: prompt + action must fit (reaching it ends the episode); ``max_action_tokens``: the
    most tokens sampled per request (a request's own ``max_tokens`` may only lower it)."""

    max_context_tokens: int
    max_action_tokens: int

    def __post_init__(self) -> None:
        if self.max_action_tokens < 1 or self.max_context_tokens <= self.max_action_tokens:
            raise ValueError(
                f"gateway limits: need 1 <= max_action_tokens ({self.max_action_tokens}) < max_context_tokens "
                f"({self.max_context_tokens}); raise max_context_tokens or lower max_action_tokens"
            )


@dataclass(frozen=True)
class GatewayReply:
    """What the gateway answers one request with (``wire.completion_body`` makes the JSON)."""

    content: str
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()

    def as_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


@dataclass(frozen=True)
class _Turn:
    """The previous answered request, what an extension must repeat: its messages' normal forms, its tools, the
    reply's normal form; and the ids it was given and sampled."""

    messages: tuple[Any, ...]
    tools: tuple[dict[str, Any], ...]
    reply: Any
    prompt_ids: tuple[int, ...]
    action_ids: tuple[int, ...]


class GatewaySession:
    """One episode: answers chat requests through ``engine`` and records rows (see the module doc)."""

    def __init__(self, session_id: str, engine: Engine, chat: ChatRenderer, limits: SessionLimits) -> None:
        self.session_id, self.engine, self.chat, self.limits = session_id, engine, chat, limits
        self.prefix_breaks = self.calls = self.engine_errors = self.discarded = 0
        self.context_exhausted = self.closing = self.closed = False
        self.key = ""  # the unguessable key its gateway serves it under
        self.last_active = time.monotonic()
        self._rows: list[list[Segment]] = []
        self._engine_calls: list[EngineCall] = []
        self._last: _Turn | None = None
        self._messages: tuple[dict[str, Any], ...] = ()
        self._stop_ids = tuple(chat.stop_token_ids())
        self._lock = asyncio.Lock()  # one request at a time: each extends what the one before left

    @property
    def busy(self) -> bool:
        """A request is being answered."""
        return self._lock.locked()

    def record(self) -> SessionRecord:
        return SessionRecord(
            session_id=self.session_id,
            rows=tuple(tuple(r) for r in self._rows),
            prefix_breaks=self.prefix_breaks,
            calls=self.calls,
            context_exhausted=self.context_exhausted,
            messages=self._messages,
            engine_calls=tuple(self._engine_calls),
            engine_errors=self.engine_errors,
            discarded=self.discarded,
        )

    async def complete(self, req: ChatRequest, gone: Callable[[], bool] = lambda: False) -> GatewayReply:
        """Answer ``req``; an ``EngineError`` propagates (nothing is recorded; a retry of the same request extends
        the session as the first try would have). ``gone``: whether the client went away; if it did by the time
        the engine answers, or the session was closed meanwhile (``closed``), the action is discarded (counted in
        ``discarded``, ``ClientGone`` / ``SessionClosed`` raised); so is one whose call is cancelled."""
        async with self._lock:
            if self.closing:
                raise SessionClosed("this session is closed or closing: open a new session")
            self.last_active = time.monotonic()
            try:
                return await self._complete(req, gone)
            except asyncio.CancelledError:
                self.discarded += int(not self.closed)  # a close counts the call it cut short itself
                raise
            finally:
                self.last_active = time.monotonic()

    async def wait_idle(self) -> None:
        """Return once no request is being answered (a close waits here for the one in flight)."""
        async with self._lock:
            pass

    async def _complete(self, req: ChatRequest, gone: Callable[[], bool]) -> GatewayReply:
        if self.context_exhausted:
            self.calls += 1
            return GatewayReply("", [], "length", 0, 0)
        normal = tuple(normal_message(m, i) for i, m in enumerate(req.messages))
        prompt, obs = self._next_prompt(req, normal)
        room = self.limits.max_context_tokens - len(prompt)
        if room < 1:
            self.prefix_breaks += int(obs is None and self._last is not None)
            return self._exhausted(req, len(prompt))
        n_max = min(self.limits.max_action_tokens, room, req.max_tokens or room)
        sp = SamplingParams(n_max, req.temperature, 1.0, req.stop, self._stop_ids)
        t0 = time.perf_counter()
        try:
            gen = await self.engine.generate(list(prompt), sp)
        except EngineError:
            self.engine_errors += 1
            raise
        engine_s = time.perf_counter() - t0
        if self.closed:
            raise SessionClosed("the session was closed while this request was answered: nothing is recorded")
        if gone():
            self.discarded += 1
            raise ClientGone("the client went away before the reply: the action is discarded")
        kept, text, stopped = self._cut_at_stop(list(gen.token_ids), req.stop)
        action_ids = tuple(gen.token_ids[:kept])
        call = EngineCall(
            len(prompt), ids_digest(prompt), gen.token_ids, gen.logprobs, gen.version, gen.finish_reason, kept, engine_s
        )
        self._engine_calls.append(call)
        action = Segment("action", action_ids, gen.logprobs[:kept], gen.version)
        if obs is not None:
            self._rows[-1] += [Segment("observation", obs), action]
        else:
            self.prefix_breaks += int(self._last is not None)
            self._rows.append([Segment("prompt", prompt), action])
        content, calls = split_tool_calls(text) if req.parse_tool_calls else (text, [])
        finish = "tool_calls" if calls else "stop" if stopped else gen.finish_reason
        if len(prompt) + kept >= self.limits.max_context_tokens:
            self.context_exhausted, finish = True, "length"
        reply = GatewayReply(content, calls, finish, len(prompt), kept, action_ids, gen.logprobs[:kept])
        self._last = _Turn(normal, req.tools, normal_message(reply.as_message()), prompt, action_ids)
        self._messages = (*req.messages, reply.as_message())
        self.calls += 1
        return reply

    def _next_prompt(self, req: ChatRequest, normal: tuple[Any, ...]) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
        """(the ids to send, the observation ids when the request extends the current row, else None)."""
        last = self._last
        messages = template_messages(self.chat, req.messages, req.tools)
        if last is not None and self._extends(last, req, normal):
            new = messages[len(messages) - (len(req.messages) - len(last.messages) - 1) :]
            obs = tuple(self.chat.render_after_action_messages(list(last.action_ids), new))
            row = tuple(t for s in self._rows[-1] for t in s.token_ids)
            # Two checks before the row grows. The row ends with exactly what the engine was last given and
            # sampled (``_last``, kept apart from the row). And the observation is the template's own rendering
            # of the new messages in this conversation: the whole conversation rendered at once ends with its text
            # (``render_after_action_messages`` renders them after a probe turn, blind to a template whose
            # rendering of a message depends on the turns before it). Either failing starts a new row.
            if obs and row == last.prompt_ids + last.action_ids and self._in_context(messages, req.tools, obs):
                return row + obs, obs
        return tuple(self.chat.render_prompt(messages, list(req.tools))), None

    def _in_context(
        self, messages: list[dict[str, Any]], tools: tuple[dict[str, Any], ...], obs: tuple[int, ...]
    ) -> bool:
        text = self.chat.tokenizer.decode(list(obs), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return self.chat.render_text(messages, list(tools)).endswith(text)

    @staticmethod
    def _extends(last: _Turn, req: ChatRequest, normal: tuple[Any, ...]) -> bool:
        k = len(last.messages)
        return (
            len(normal) > k + 1
            and req.tools == last.tools
            and normal[:k] == last.messages
            and normal[k] == last.reply
            and all(m[0] != "assistant" for m in normal[k + 1 :])
        )

    def _exhausted(self, req: ChatRequest, prompt_tokens: int) -> GatewayReply:
        """The prompt leaves no room for an action: the episode ends here, nothing is appended."""
        self.context_exhausted = True
        self.calls += 1
        reply = GatewayReply("", [], "length", prompt_tokens, 0)
        self._messages = (*req.messages, reply.as_message())
        return reply

    def _cut_at_stop(self, ids: list[int], stops: tuple[str, ...]) -> tuple[int, str, bool]:
        """(tokens kept, reply text, whether a stop string ended it): cut after the token completing the earliest
        stop string; the text ends before it, as the OpenAI API returns it."""
        text = self.chat.action_text(ids)
        hits = [text.find(s) for s in stops if s in text]
        if not hits:
            return len(ids), text, False
        lo, hi = 1, len(ids)  # the shortest prefix whose text holds a stop string (binary search: decodes are slow)
        while lo < hi:
            mid = (lo + hi) // 2
            if any(s in self.chat.action_text(ids[:mid]) for s in stops):
                hi = mid
            else:
                lo = mid + 1
        return lo, text[: min(hits)], True
