"""``trainer.baseline_key``: a running mean kept per value of an episode info field (e.g. the chain level), the
state-aware baseline without a critic that the critic's job measures SAO against (issue 45)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from sao.agent.records import Segment, Trajectory
from sao.trainer.algos.advantages import RunningMeanBaseline
from sao.trainer.algos.registry import AdvantageInputs, get_advantage
from sao.trainer.config import ConfigError, config_from_dict
from sao.trainer.learn.batch import collate
from sao.trainer.learn.learner import baseline_keys


def _episode(reward: float, level: int | None) -> Trajectory:
    segs = (Segment("prompt", (1,)), Segment("action", (2, 3), (-0.1, -0.1), 0))
    info = {} if level is None else {"level": level}
    return Trajectory(f"task-{level}", "s", segs, reward, info=info)


def test_each_key_is_scored_against_its_own_mean() -> None:
    base = RunningMeanBaseline()
    base.update(torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0]), keys=["1", "1", "4", "4", "4"])
    assert base.by_key == {"1": (1.0, 2), "4": (0.0, 3)} and base.mean == pytest.approx(0.4)
    adv = base.advantage(torch.tensor([1.0, 1.0, 1.0]), keys=["1", "4", "2"])
    # level 1 always solved: no credit; level 4 never: full credit; level 2 unseen: the mean over all keys
    assert adv.tolist() == pytest.approx([0.0, 1.0, 0.6])
    assert base.advantage(torch.tensor([1.0])).tolist() == pytest.approx([0.6])  # no keys: the one mean


def test_keyed_means_decay_and_survive_a_resume() -> None:
    ema = RunningMeanBaseline(decay=0.5)
    ema.update(torch.tensor([1.0, 0.0, 0.0]), keys=["a", "a", "b"])
    assert ema.by_key["a"] == (pytest.approx(0.5), 2)  # first reward taken whole, the second by the EMA
    clone = RunningMeanBaseline()
    clone.load_state_dict(json.loads(json.dumps(ema.state_dict())))  # as the run's trainer state stores it
    assert clone.by_key == ema.by_key and clone.mean == ema.mean
    old = RunningMeanBaseline()
    old.load_state_dict({"decay": None, "mean": 0.3, "count": 4})  # a checkpoint written before the keys
    assert old.by_key == {} and old.mean == 0.3
    with pytest.raises(ValueError, match="2 keys for 3 rewards"):
        ema.update(torch.tensor([1.0, 0.0, 1.0]), keys=["a", "b"])


def test_the_running_mean_entry_keys_each_episode_once() -> None:
    rows = [_episode(1.0, 1), _episode(1.0, 1), _episode(0.0, 4)]
    b = collate(rows, 0, episodes=[0, 0, 1])
    base = RunningMeanBaseline()
    base.update(torch.tensor([0.0, 1.0]), keys=["1", "4"])
    inputs = AdvantageInputs(
        rewards=b.rewards,
        action_mask=b.action_mask,
        episode_ids=b.episode_ids,
        baseline=base,
        baseline_keys=baseline_keys(rows, "level"),
    )
    adv, _ = get_advantage("running_mean")(inputs)
    assert (adv.sum(dim=1) / 2).tolist() == pytest.approx([1.0, 1.0, -1.0])
    assert base.by_key["1"] == (pytest.approx(0.5), 2) and base.count == 4  # the two-row episode counted once


def test_an_episode_without_the_key_names_the_field_and_the_fix() -> None:
    assert baseline_keys([_episode(1.0, 2)], "") is None
    assert baseline_keys([_episode(1.0, 2)], "level") == ("2",)
    unscored = dataclasses.replace(_episode(0.0, None), reward=float("nan"))  # no baseline reads it: no key needed
    assert baseline_keys([_episode(1.0, 2), unscored], "level") == ("2", "")
    with pytest.raises(ConfigError, match=r"no 'level'.*clear trainer.baseline_key"):
        baseline_keys([_episode(1.0, 2), _episode(0.0, None)], "level")


def test_a_key_without_a_running_mean_is_refused() -> None:
    ok = config_from_dict({"trainer": {"algorithm": "running_mean", "baseline_key": "level"}})
    assert ok.trainer.baseline_key == "level"
    with pytest.raises(ConfigError, match="baseline_key 'level' keys a running-mean baseline"):
        config_from_dict({"trainer": {"algorithm": "grpo", "group_size": 4, "baseline_key": "level"}})
