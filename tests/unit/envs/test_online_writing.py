"""OnlineWriting-v0: the judge's checks, the shared shifting schedule, and Gymnasium's checker."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import sao.envs  # noqa: F401 - registers the ids
from sao.envs.online_writing import OnlineWritingEnv, StyleSchedule, judge


@pytest.mark.parametrize(
    ("text", "style", "reward"),
    [
        ("Rain is soft.", "brief", 1.0),
        ("Rain, soft and grey, falls on every roof in town.", "brief", 0.0),
        ("I love rain!", "excited", 1.0),
        ("I love snow!", "excited", 0.5),
        ("Why does rain fall?", "question", 1.0),
        ("Rain falls?", "question", 0.5),
        ("RAIN IS HERE", "shout", 1.0),
        ("rain is here", "calm", 1.0),
        ("Rain is here!", "calm", 0.0),
        ("   ", "brief", 0.0),
    ],
)
def test_judge(text: str, style: str, reward: float) -> None:
    assert judge(text, "rain", style)[0] == reward


def test_style_shifts_every_n_episodes_across_instances() -> None:
    sched = StyleSchedule(shift_every=2, styles=["brief", "shout"])
    a, b = OnlineWritingEnv(schedule=sched), OnlineWritingEnv(schedule=sched)
    rewards = []
    for env in (a, b, a, b, a):
        env.reset(options={"task": {"topic": "rain"}})
        _, r, term, _, info = env.step("RAIN IS HERE, LOUD")
        assert term
        rewards.append((info["report"]["style"], r))
    assert rewards == [("brief", 0.5), ("brief", 0.5), ("shout", 1.0), ("shout", 1.0), ("brief", 0.5)]


def test_shared_schedule_by_name_and_reveal() -> None:
    x = OnlineWritingEnv(schedule="test-shared", shift_every=3)
    y = OnlineWritingEnv(schedule="test-shared")
    assert x.schedule is y.schedule
    obs, _ = OnlineWritingEnv(schedule=StyleSchedule(5, ["calm"]), reveal_style=True).reset(seed=0)
    assert obs.endswith("Style: calm.")


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="unknown styles"):
        StyleSchedule(styles=["loud"])
    with pytest.raises(ValueError, match="'topic'"):
        OnlineWritingEnv(schedule=StyleSchedule()).reset(options={"task": {"subject": "x"}})


def test_check_env_passes() -> None:
    env = gym.make("sao/OnlineWriting-v0")
    check_env(env.unwrapped)
    env.close()
