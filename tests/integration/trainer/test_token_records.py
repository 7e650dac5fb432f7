"""Per-token records (``trainer.token_records``) from a real training step: what they say is what the loss used."""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import pytest

from sao.agent.records import Segment, Trajectory
from sao.trainer.config import config_from_dict
from tests.integration.trainer._helpers import synthetic_trajectories

pytestmark = [pytest.mark.deepspeed]


def _learner(token_records: int, **trainer: object) -> tuple[Any, list[Trajectory]]:
    from sao.trainer import distributed
    from sao.trainer.learn.learner import Learner
    from sao.trainer.learn.models import load_actor, load_critic

    distributed.init_distributed()
    band = {"dis_band": "custom", "eps_low": 0.5, "eps_high": 1.0}
    cfg = config_from_dict(
        {
            "model": {"path": "tiny:llama"},
            "trainer": {
                "algorithm": "sao",
                "batch_size": 4,
                "lr": 1e-3,
                "token_records": token_records,
                **band,
                **trainer,
            },
            "critic": {"lr": 1e-3},
            "deepspeed": {"micro_batch_size": 2},
        }
    )
    actor = load_actor(cfg)
    critic = load_critic(cfg, actor)
    return Learner(cfg, actor, critic, pad_token_id=0), synthetic_trajectories(actor, 4)


def _shift(traj: Trajectory, turn: int, token: int, by: float) -> Trajectory:
    """``traj`` with the engine logprob of one action token moved by ``by`` (the ratio becomes ``exp(-by)``)."""
    segs = list(traj.segments)
    seg = [s for s in segs if s.kind == "action"][turn]
    lp = list(seg.logprobs or ())
    lp[token] += by
    segs[segs.index(seg)] = Segment("action", seg.token_ids, lp, seg.policy_version, seg.reward)
    return dataclasses.replace(traj, segments=tuple(segs))


def test_records_hold_the_ratio_mask_advantage_and_value_the_step_used(deepspeed_env: dict[str, str]) -> None:
    learner, trajs = _learner(4)
    # engine logprobs moved on two tokens: ratio e^2 (above the band 0.5..2) and e^-2 (below it)
    trajs[1] = _shift(trajs[1], 0, 1, -2.0)
    trajs[2] = _shift(trajs[2], 1, 0, 2.0)
    m = learner.train_step(trajs)
    rows = sorted(learner.token_rows, key=lambda r: r.row)
    assert [r.row for r in rows] == [0, 1, 2, 3], "token_records=4 of a batch of 4 records every row"
    n_tokens = sum(len(r.mask or "") for r in rows)
    for r in rows:
        traj = trajs[r.row]
        engine = [x for s in traj.action_segments for x in (s.logprobs or ())]
        assert r.engine_logp == pytest.approx(engine, abs=1e-4)
        assert r.policy_step and r.new_logp is not None and r.ratio is not None and r.value is not None
        for new, eng, ratio in zip(r.new_logp, r.engine_logp, r.ratio, strict=True):
            assert new is not None and eng is not None and ratio is not None
            assert ratio == pytest.approx(math.exp(new - eng), rel=1e-3)
        # gamma = lam = 1, no whitening: every action token's advantage is the episode's return minus its value
        for adv, val in zip(r.advantage, r.value, strict=True):
            assert adv is not None and val is not None
            assert adv + val == pytest.approx(traj.reward, abs=1e-3)
    assert rows[1].mask == "khkkkk" and rows[2].mask == "kkklkk", [r.mask for r in rows]
    assert rows[0].mask == rows[3].mask == "kkkkkk"
    assert m["mask_frac_high"] == pytest.approx(1 / n_tokens) and m["mask_frac_low"] == pytest.approx(1 / n_tokens)


def test_off_by_default_and_a_skipped_policy_step_records_no_new_logprob(deepspeed_env: dict[str, str]) -> None:
    learner, trajs = _learner(0)
    learner.train_step(trajs)
    assert learner.token_rows == []
    learner, trajs = _learner(2, skip_uniform_reward_batches=True)
    same = [dataclasses.replace(t, reward=1.0) for t in trajs]
    same = [_final_reward(t, 1.0) for t in same]
    m = learner.train_step(same)
    assert m.get("skipped_uniform_batches") == 1.0
    assert len(learner.token_rows) == 2
    for r in learner.token_rows:
        assert not r.policy_step and r.new_logp is None and r.mask is None and r.advantage


def _final_reward(traj: Trajectory, reward: float) -> Trajectory:
    segs = list(traj.segments)
    last = segs[-1]
    segs[-1] = Segment("action", last.token_ids, last.logprobs, last.policy_version, reward)
    return dataclasses.replace(traj, segments=tuple(segs))


def test_recording_costs_under_five_percent_of_a_step(
    deepspeed_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Recording every row of the batch (the most it can cost): the work it adds to a step (the sample, keeping the
    logprobs, building the rows, the record lines and their fsynced append) timed inside real steps, against those
    steps' own time. Timing the added work itself, not step minus step, keeps the check steady on a loaded machine."""
    from sao.trainer.learn import token_records as tr

    spent = [0.0]

    def timed(fn: Any) -> Any:
        def run(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t0

        return run

    for name in ("saw", "rows"):
        monkeypatch.setattr(tr.TokenProbe, name, timed(getattr(tr.TokenProbe, name)))
    monkeypatch.setattr(tr.TokenProbe, "sample", classmethod(timed(tr.TokenProbe.sample.__func__)))
    learner, trajs = _learner(4)
    learner.train_step(trajs)  # warm-up
    out = tmp_path
    spent[0], step_s = 0.0, 0.0
    for i in range(5):
        t0 = time.perf_counter()
        learner.train_step(trajs)
        step_s += time.perf_counter() - t0
        t1 = time.perf_counter()
        lines = [tr.token_record(i, i, "dis", f"u{r.row}", trajs[r.row], r) for r in learner.token_rows]
        tr.write_token_records(out / "token_records.jsonl", lines)
        spent[0] += time.perf_counter() - t1
    size = (out / "token_records.jsonl").stat().st_size
    assert spent[0] < 0.05 * step_s, f"recording took {spent[0] * 1e3:.1f} ms of {step_s * 1e3:.1f} ms of steps"
    assert len(lines) == 4 and size < 5 * 4 * 1000, f"{size} bytes for 5 steps of 4 rows of 6 action tokens"
