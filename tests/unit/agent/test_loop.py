"""run_episode with a scripted engine and env: token exactness, versions, rewards, end states, timings."""

from __future__ import annotations

import pytest
from agent_fakes import CharChatMLTokenizer, ScriptedEnv

from sao.agent.chat import TOOLS_TEXT_FORMAT, ChatRenderer
from sao.agent.engines.scripted import ScriptedEngine
from sao.agent.loop import AgentConfig, run_episode

TOK = CharChatMLTokenizer()
EOS = TOK.eos_token_id


def act(text: str, eos: bool = True) -> list[int]:
    return TOK.encode(text) + ([EOS] if eos else [])


async def test_three_turns_concatenate_to_the_template_rendering() -> None:
    actions = ["ls", "cat a.py", "submit"]
    env = ScriptedEnv(
        [
            ("a.py", 0.0, False, False, {"role": "tool"}),
            ("print(1)", 0.0, False, False, {}),
            ("done", 1.0, True, False, {}),
        ]
    )
    engine = ScriptedEngine([act(a) for a in actions])
    traj = await run_episode(env, engine, TOK, AgentConfig(), task_id="t1")
    assert traj.status == "ok" and traj.reward == 1.0 and env.actions == actions
    assert [s.kind for s in traj.segments] == ["prompt", "action", "observation", "action", "observation", "action"]
    # The model saw exactly the template's rendering of the conversation (tool role -> user: no tool support).
    msgs = [
        {"role": "system", "content": env.system_prompt},
        {"role": "user", "content": env.task},
        {"role": "assistant", "content": "ls"},
        {"role": "user", "content": "a.py"},
        {"role": "assistant", "content": "cat a.py"},
        {"role": "user", "content": "print(1)"},
        {"role": "assistant", "content": "submit"},
    ]
    full = TOK.encode(TOK.apply_chat_template(msgs))
    assert traj.token_ids == full[: len(traj.token_ids)]
    assert full[len(traj.token_ids) :] == TOK.encode("\n")  # the template's newline after the last <|im_end|>
    # Each prompt the engine got is the trajectory so far.
    assert engine.prompts[2] == traj.token_ids[: len(engine.prompts[2])]
    assert traj.info["final_observation"] == "done" and traj.info["turns"] == 3
    assert [s.reward for s in traj.action_segments] == [0.0, 0.0, 1.0]


async def test_each_action_keeps_the_version_that_sampled_it() -> None:
    env = ScriptedEnv([("o1", 0.0, False, False, {}), ("o2", 1.0, True, False, {})])
    engine = ScriptedEngine([act("a"), act("b")], version=3)
    orig = engine.generate

    async def bump_after_first(ids: list[int], sp):  # type: ignore[no-untyped-def]
        g = await orig(ids, sp)
        engine._version += 1  # the trainer pushed new weights between the turns
        return g

    engine.generate = bump_after_first  # type: ignore[method-assign]
    traj = await run_episode(env, engine, TOK, AgentConfig())
    assert [s.policy_version for s in traj.action_segments] == [3, 4]
    assert traj.oldest_policy_version == 3


async def test_action_cut_at_max_tokens_gets_the_turn_closed_by_an_observation_token() -> None:
    env = ScriptedEnv([("o1", 0.0, False, False, {}), ("o2", 0.0, True, False, {})])
    engine = ScriptedEngine([act("abcdefgh", eos=False), act("x")])
    traj = await run_episode(env, engine, TOK, AgentConfig(max_action_tokens=4, max_context_tokens=4096))
    first_action, first_obs = traj.segments[1], traj.segments[2]
    assert len(first_action.token_ids) == 4 and EOS not in first_action.token_ids
    assert first_obs.token_ids[0] == EOS  # <|im_end|> written by the template, not sampled
    assert env.actions[0] == "abcd"


async def test_context_length_ends_the_episode_as_truncated() -> None:
    env = ScriptedEnv([("x" * 200, 0.0, False, False, {})] * 10)
    engine = ScriptedEngine([act("go")])
    cfg = AgentConfig(max_context_tokens=400, max_action_tokens=8)
    traj = await run_episode(env, engine, TOK, cfg)
    assert traj.status == "truncated" and traj.info["truncation_reason"] == "context_length"
    assert all(len(p) < cfg.max_context_tokens for p in engine.prompts)
    # The observation that did not fit is not appended: the trajectory stays within the budget and ends on an
    # action (what the trainer bootstraps from), and the model never saw that observation.
    assert traj.num_tokens <= cfg.max_context_tokens and traj.segments[-1].kind == "action"
    assert traj.info["final_observation"] == "x" * 200 and len(env.actions) == traj.info["turns"]


async def test_an_action_that_fills_the_context_is_kept_but_not_executed() -> None:
    env = GradingEnv([("o", 0.0, False, False, {})] * 10)
    prompt = await run_episode(
        ScriptedEnv([("o", 1.0, True, False, {})]), ScriptedEngine([act("a")]), TOK, AgentConfig()
    )
    n_prompt = len(prompt.segments[0].token_ids)
    # Room for 11 tokens: the 20-token action is cut there by the budget.
    cfg = AgentConfig(max_context_tokens=n_prompt + 11, max_action_tokens=20)
    engine = ScriptedEngine([act("y" * 20, eos=False)])
    traj = await run_episode(env, engine, TOK, cfg)
    assert env.actions == [] and env.ended == ["context_length"]  # never executed; the env graded what exists
    assert traj.status == "truncated" and traj.info["truncation_reason"] == "context_length"
    assert [s.kind for s in traj.segments] == ["prompt", "action"] and len(traj.segments[1].token_ids) == 11
    assert traj.num_tokens == cfg.max_context_tokens and traj.segments[1].reward == 1.0  # the grade sits on it
    # Room for 12, actions of at most 11: the action runs, its observation does not fit, the episode ends there.
    env = GradingEnv([("o", 0.0, False, False, {})] * 10)
    cfg = AgentConfig(max_context_tokens=n_prompt + 12, max_action_tokens=11)
    traj = await run_episode(env, engine, TOK, cfg)
    assert env.actions == ["y" * 11] and env.ended == ["context_length"] and traj.segments[-1].kind == "action"
    assert traj.num_tokens == n_prompt + 11 and traj.info["final_observation"] == "o"


async def test_a_prompt_that_fills_the_context_is_a_config_error() -> None:
    env = ScriptedEnv([("o", 1.0, True, False, {})], task="t" * 300)
    with pytest.raises(ValueError, match="max_context_tokens"):
        cfg = AgentConfig(max_context_tokens=200, max_action_tokens=8)
        await run_episode(env, ScriptedEngine([act("a")]), TOK, cfg)


async def test_env_truncation_and_step_cap() -> None:
    env = ScriptedEnv([("o", 0.0, False, True, {"truncation_reason": "step_limit"})])
    traj = await run_episode(env, ScriptedEngine([act("a")]), TOK, AgentConfig())
    assert traj.status == "truncated" and traj.info["truncation_reason"] == "step_limit"
    env = ScriptedEnv([("o", 0.0, False, False, {})] * 5)
    traj = await run_episode(env, ScriptedEngine([act("a")]), TOK, AgentConfig(max_turns=2))
    assert traj.status == "truncated" and traj.info["truncation_reason"] == "max_turns" and len(env.actions) == 2


async def test_infra_errors_from_env_and_engine() -> None:
    env = ScriptedEnv([("", 0.0, False, True, {"infra_error": "SandboxError: container died"})])
    traj = await run_episode(env, ScriptedEngine([act("a")]), TOK, AgentConfig())
    assert traj.status == "infra_error" and "container died" in traj.info["infra_error"]
    env = ScriptedEnv([("o", 0.0, False, False, {})] * 3)
    traj = await run_episode(env, ScriptedEngine([act("a")], fail_after=1), TOK, AgentConfig())
    assert traj.status == "infra_error" and traj.info["infra_error"].startswith("engine:")
    assert len(traj.action_segments) == 1  # the turns done before the failure are kept on disk


async def test_format_error_observation_is_shown_to_the_model() -> None:
    msg = "Format error: call a tool as <tool_call>{...}</tool_call>"
    env = ScriptedEnv([(msg, 0.0, False, False, {"format_error": True}), ("ok", 1.0, True, False, {})])
    engine = ScriptedEngine([act("<tool_call>{not json</tool_call>"), act("fixed")])
    traj = await run_episode(env, engine, TOK, AgentConfig())
    assert msg in TOK.decode(list(traj.segments[2].token_ids))
    assert traj.status == "ok"


async def test_timings_cover_engine_and_env() -> None:
    env = ScriptedEnv([("o", 0.0, True, False, {})])
    traj = await run_episode(env, ScriptedEngine([act("a")], delay_s=0.05), TOK, AgentConfig())
    t = traj.timings
    assert t["engine_s"] >= 0.05 and t["total_s"] >= t["engine_s"] + t["env_s"]


def test_tools_go_to_the_system_prompt_when_the_template_has_no_tool_support() -> None:
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    chat = ChatRenderer(TOK)
    msgs = chat.initial_messages("sys", "task", tools)
    assert msgs[0]["content"].startswith("sys") and '"name": "bash"' in msgs[0]["content"]
    assert TOOLS_TEXT_FORMAT.split("{schemas}")[0].format() in msgs[0]["content"]


def test_bad_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="max_context_tokens"):
        AgentConfig(max_context_tokens=100, max_action_tokens=100)


# ---- per-turn rewards, the agent's own limit, render drift ----------------------------------------------------
async def test_each_turns_reward_lands_on_its_own_action_segment() -> None:
    env = ScriptedEnv([("o1", 0.5, False, False, {}), ("o2", 0.0, False, False, {}), ("o3", 1.0, True, False, {})])
    traj = await run_episode(env, ScriptedEngine([act("a")]), TOK, AgentConfig())
    assert [s.reward for s in traj.action_segments] == [0.5, 0.0, 1.0] and traj.reward == 1.5


class GradingEnv(ScriptedEnv):
    """A ScriptedEnv that grades what exists when the agent ends the episode (like MultiTurnEnv.aend)."""

    def __init__(self, *a, grade: tuple[float, dict] = (1.0, {"solved": True}), **kw) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*a, **kw)
        self.grade, self.ended = grade, []

    async def aend(self, reason: str):  # type: ignore[no-untyped-def]
        self.ended.append(reason)
        return self.grade


async def test_the_agents_turn_cap_lets_the_env_grade_and_the_reward_joins_the_last_action() -> None:
    env = GradingEnv([("o", 0.0, False, False, {})] * 5)
    traj = await run_episode(env, ScriptedEngine([act("a")]), TOK, AgentConfig(max_turns=2))
    assert env.ended == ["max_turns"] and traj.status == "truncated" and traj.info["solved"] is True
    assert [s.reward for s in traj.action_segments] == [0.0, 1.0] and traj.reward == 1.0
    env = GradingEnv([("o", 0.0, False, False, {})] * 5, grade=(0.0, {"infra_error": "SandboxError: gone"}))
    traj = await run_episode(env, ScriptedEngine([act("a")]), TOK, AgentConfig(max_turns=2))
    assert traj.status == "infra_error" and "gone" in traj.info["infra_error"]
    env = GradingEnv([("o", 1.0, True, False, {})])  # the env ended it: no second grading
    await run_episode(env, ScriptedEngine([act("a")]), TOK, AgentConfig())
    assert env.ended == []


class StrippingTokenizer(CharChatMLTokenizer):
    """A template that strips assistant content when rendering history: not prefix-stable for such actions."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False, **kw):  # type: ignore[no-untyped-def]
        msgs = [{**m, "content": m["content"].strip()} if m["role"] == "assistant" else m for m in messages]
        return super().apply_chat_template(msgs, tokenize, add_generation_prompt, **kw)


async def test_render_drift_is_zero_for_a_prefix_stable_template_and_measured_otherwise() -> None:
    steps = [("o1", 0.0, False, False, {}), ("o2", 0.0, False, False, {}), ("o3", 1.0, True, False, {})]
    traj = await run_episode(ScriptedEnv(steps), ScriptedEngine([act("a  ")]), TOK, AgentConfig(), check_render=True)
    assert traj.info["render_drift"] == 0.0 and traj.info["render_drift_at"] == -1
    tok = StrippingTokenizer()
    traj = await run_episode(ScriptedEnv(steps), ScriptedEngine([act("a  ")]), tok, AgentConfig(), check_render=True)
    assert 0.0 < traj.info["render_drift"] < 1.0
    first_action = len(traj.segments[0].token_ids)
    assert traj.info["render_drift_at"] == first_action + 1  # right after "a": the model saw the spaces
    traj = await run_episode(ScriptedEnv(steps), ScriptedEngine([act("a  ")]), tok, AgentConfig())
    assert "render_drift" not in traj.info  # only checked when asked (a sample of episodes)
