"""trainer.skip_uniform_reward_batches: a batch whose trajectories all earned the same reward takes no actor step
(its advantages would be only the critic's errors), while the critic still takes its K steps."""

from __future__ import annotations

import dataclasses

import pytest

from sao.agent.records import Trajectory
from tests.integration.trainer.test_step import _changed, _count_optimizer_steps, _learner, _snapshot

pytestmark = [pytest.mark.deepspeed]


def _all_reward(trajs: list[Trajectory], reward: float) -> list[Trajectory]:
    out = []
    for tr in trajs:
        segs = tuple(dataclasses.replace(s, reward=None) if s.reward is not None else s for s in tr.segments)
        out.append(dataclasses.replace(tr, reward=reward, segments=segs))
    return out


def test_uniform_reward_batch_skips_only_the_policy_step(deepspeed_env: dict[str, str]) -> None:
    learner, trajs = _learner("sao", kind="llama", critic_updates_per_step=2, skip_uniform_reward_batches=True)
    counts = _count_optimizer_steps(learner)
    a0, c0 = _snapshot(learner.actor.module), _snapshot(learner.critic.module)
    m = learner.train_step(_all_reward(trajs, 1.0))
    assert m["skipped_uniform_batches"] == 1 and m["skipped_steps"] == 1
    assert counts == {"actor": 0, "critic": 2}
    assert not _changed(a0, learner.actor.module) and _changed(c0, learner.critic.module)
    # a batch with different rewards trains the actor as usual
    m = learner.train_step(trajs)
    assert counts == {"actor": 1, "critic": 4} and "skipped_uniform_batches" not in m
    assert _changed(a0, learner.actor.module)


def test_off_by_default_a_uniform_batch_still_steps(deepspeed_env: dict[str, str]) -> None:
    learner, trajs = _learner("sao", kind="llama", critic_updates_per_step=1)
    counts = _count_optimizer_steps(learner)
    learner.train_step(_all_reward(trajs, 0.0))
    assert counts == {"actor": 1, "critic": 1}


def test_zero_advantage_batch_takes_no_optimizer_step(deepspeed_env: dict[str, str]) -> None:
    """GRPO on groups that all earned the same reward: every advantage is 0, so the loss has no gradient; an Adam
    step would still move the weights by its momentum from the previous batch. The learner skips it."""
    learner, trajs = _learner("grpo", kind="llama")
    counts = _count_optimizer_steps(learner)
    m = learner.train_step(trajs)  # a batch with signal: Adam's moments are now non-zero
    assert counts["actor"] == 1 and "skipped_zero_advantage" not in m
    a0 = _snapshot(learner.actor.module)
    m = learner.train_step(_all_reward(trajs, 1.0))
    assert m["skipped_zero_advantage"] == 1 and m["skipped_steps"] == 1 and m["trained_tokens"] == 0
    assert counts["actor"] == 1
    assert not _changed(a0, learner.actor.module)
