"""TokenGame-v0: rules, rewards in both modes, seeding, bad tasks, and Gymnasium's checker."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import sao.envs  # noqa: F401 - registers the ids
from sao.envs.token_game import TokenGameEnv


def play(env: TokenGameEnv, answers: list[str]) -> tuple[list[float], dict]:
    rewards, info = [], {}
    for i, a in enumerate(answers):
        _, r, term, trunc, info = env.step(a)
        rewards.append(r)
        assert trunc is False
        assert term is (i == len(answers) - 1)
    return rewards, info


def test_check_env_passes() -> None:
    env = gym.make("sao/TokenGame-v0")
    check_env(env.unwrapped)
    env.close()


def test_all_mode_pays_only_when_every_turn_is_right() -> None:
    env = TokenGameEnv(turns=3)
    obs, info = env.reset(options={"task": {"sequence": ["B", "A", "C"]}})
    assert obs.endswith("Turn 1/3: B") and info["allowed_actions"] == ["A", "B", "C"]
    rewards, info = play(env, ["B", " a. ", "'C'"])
    assert rewards == [0.0, 0.0, 1.0] and info["solved"] is True
    env.reset(options={"task": {"sequence": ["B", "A", "C"]}})
    rewards, info = play(env, ["B", "B", "C"])
    assert rewards == [0.0, 0.0, 0.0] and info["solved"] is False
    assert info["report"]["correct"] == [True, False, True]


def test_partial_mode_and_next_rule() -> None:
    env = TokenGameEnv(turns=2, symbols="ABC", rule="next", reward="partial")
    env.reset(options={"task": {"sequence": ["C", "A"]}})
    rewards, info = play(env, ["A", "A"])  # C -> A right (cyclic), A -> B wrong
    assert rewards == [0.5, 0.0] and info["solved"] is False


def test_observation_shows_the_next_symbol_each_turn() -> None:
    env = TokenGameEnv(turns=3)
    env.reset(options={"task": {"sequence": ["A", "C", "B"]}})
    obs, *_ = env.step("x")
    assert obs == "Turn 2/3: C"
    obs, *_ = env.step("x")
    assert obs == "Turn 3/3: B"


def test_feedback_counts_the_mistakes_so_far_in_each_later_observation() -> None:
    env = TokenGameEnv(turns=4, feedback=True)
    obs, _ = env.reset(options={"task": {"sequence": ["A", "C", "B", "A"]}})
    assert obs.endswith("Turn 1/4: A")  # nothing answered yet
    seen = [env.step(a)[0] for a in ("A", "B", "B")]  # right, wrong, right
    assert seen == ["Turn 2/4 mistakes 0: C", "Turn 3/4 mistakes 1: B", "Turn 4/4 mistakes 1: A"]
    _, reward, term, _, info = env.step("A")
    assert term and reward == 0.0 and info["solved"] is False  # one mistake dooms the all-or-nothing episode


def test_seed_draws_reproducible_sequences() -> None:
    env = TokenGameEnv(turns=5)
    a = env.reset(seed=7)[1]["task_id"]
    assert env.reset(seed=8)[1]["task_id"] != a or env.reset(seed=9)[1]["task_id"] != a
    assert env.reset(seed=7)[1]["task_id"] == a
    seen = {env.reset(seed=s)[1]["task_id"] for s in range(20)}
    assert len(seen) > 10


def test_bad_task_and_options_are_clear_errors() -> None:
    env = TokenGameEnv(turns=2)
    with pytest.raises(ValueError, match="'sequence'"):
        env.reset(options={"task": {"seq": ["A", "B"]}})
    with pytest.raises(ValueError, match="2 symbols"):
        env.reset(options={"task": {"sequence": ["A", "Z"]}})
    with pytest.raises(ValueError, match="rule"):
        TokenGameEnv(rule="mirror")


def test_step_before_reset_and_after_end_raise() -> None:
    env = TokenGameEnv(turns=1)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("A")
    env.reset(seed=0)
    env.step("A")
    with pytest.raises(RuntimeError, match="reset"):
        env.step("A")


async def test_async_api_and_sync_inside_loop_error() -> None:
    env = TokenGameEnv(turns=1)
    _, _info = await env.areset(options={"task": {"sequence": ["B"]}})
    _, r, term, _, _ = await env.astep("B")
    assert r == 1.0 and term
    with pytest.raises(RuntimeError, match="areset"):
        env.reset(seed=0)
    await env.aclose()


def test_a_list_of_turns_gives_tasks_of_each_length() -> None:
    env = TokenGameEnv(turns=[1, 4], symbols="AB", reward="partial")
    lengths = set()
    for seed in range(40):
        obs, info = env.reset(seed=seed)
        n = len(info["task_id"].split("-"))
        lengths.add(n)
        assert obs.endswith(f"Turn 1/{n}: {info['task_id'].split('-')[0]}")
        rewards, last = play(env, [s for s in info["task_id"].split("-")])
        assert rewards == [1.0 / n] * n and last["solved"] is True
    assert lengths == {1, 4}
    with pytest.raises(ValueError, match="1 or 4 symbols"):
        env.reset(options={"task": {"sequence": ["A", "B"]}})
    with pytest.raises(ValueError, match="turns must be >= 1"):
        TokenGameEnv(turns=[])
    # one length keeps the seeded tasks it drew before lists existed
    assert TokenGameEnv(turns=[3]).reset(seed=5)[1]["task_id"] == TokenGameEnv(turns=3).reset(seed=5)[1]["task_id"]
