"""`sao train configs/swe_quickstart.yaml` at smoke size (the demonstrator on 2 SWE tasks in Docker, then one RL
step of real SmolLM2 on an episode's row), then what the trainer consumed, checked on the very trajectories it
trained (the run's ledger) with its own code: observation tokens get no advantage and no policy gradient, each
turn's reward sits on its last action token, a cut episode the SWE env graded is terminal (no bootstrap from V: its
return is complete), and the SWE rollouts made a policy step that moved the weights.

Sizes: CPU training on SmolLM2 costs ~25 CPU-s per 1k tokens of forward+backward, so the smoke keeps episodes
short: a 1,400-token context budget (the prompts alone are 750-1,100 tokens) ends every episode truncated within a
turn or two, which is also what it checks (the budget rule, the end-of-episode rule). The demonstrations are cut by
the same budget before their fix, so the smoke trains RL from the base model (no SFT stage; `test_quickstart` covers
SFT); the full job is a benchmark (its numbers are in docs/results.md). The training step's cost is per row, so the
smoke trains one; ``full`` trains two (the padded batch) at the job's K = 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.conftest import cli_env

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.deepspeed]
ROOT = Path(__file__).resolve().parents[3]
SMOKE = [
    "stages=[collect,train]", "env.tasks=swe-offline:smoke", "collect.n=2", "run.total_steps=1", "run.save_every=1",
    "trainer.warmup_steps=0", "trainer.critic_warmup_steps=0", "rollout.max_turns=4", "rollout.max_tokens=128",
    "rollout.max_context_tokens=1400", "run.plot=false", "run.progress=false",
]  # fmt: skip
# The smoke's training step without what only costs time at this size (the checks hold row by row): one row of one
# episode, one critic step instead of K = 2. (Gradient checkpointing stays: without it the trainer peaked at 6.4 GB
# and was OOM-killed beside the other suites on this 24 GiB machine.) The ``full`` size trains two rows of two
# tasks (padded to one batch) with the job's own settings.
ONE_ROW = [
    "trainer.batch_size=1", "rollout.concurrency=1", "rollout.buffer_size=1", "deepspeed.micro_batch_size=1",
    "trainer.critic_updates_per_step=1",
]  # fmt: skip
TWO_ROWS = ["trainer.batch_size=2", "rollout.concurrency=2", "rollout.buffer_size=2", "deepspeed.micro_batch_size=2"]


def _trained(run: Path) -> list[Any]:
    """The trajectories the train stage's policy step consumed, from its ledger."""
    from sao.agent.records import Trajectory

    by_uid: dict[str, Any] = {}
    trained: list[str] = []
    for line in (run / "trajectories.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["type"] == "trajectory":
            by_uid[rec["uid"]] = Trajectory.from_dict(rec["trajectory"])
        elif rec["type"] == "event" and rec["event"] == "trained":
            trained.append(rec["uid"])
    return [by_uid[u] for u in trained]


def check_what_the_trainer_consumed(train: Path, start_model: Path, budget: int, rows: int) -> None:
    """The checks of the module doc on a finished train stage ``train`` that started from ``start_model`` and
    trained one batch of ``rows`` trajectories."""
    from safetensors.torch import load_file

    from sao.trainer.algos.registry import PolicyLossInputs, advantage_traits, get_advantage, get_policy_loss
    from sao.trainer.config import load_config
    from sao.trainer.learn.batch import collate
    from sao.trainer.learn.learner import Learner
    from sao.trainer.learn.models import shifted_values
    from sao.trainer.learn.targets import value_after

    trajs = _trained(train)
    assert len(trajs) == rows and all(t.env_id == "sao/SWE-v0" for t in trajs)
    assert all("observation" in [s.kind for s in t.segments] for t in trajs)  # real tool output came back
    (row,) = [json.loads(x) for x in (train / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and row["trained_tokens"] > 0 and row["skipped_steps"] == 0
    assert row["actor_grad_norm"] > 0

    cfg = load_config(train / "config.yaml", [])
    batch = collate(trajs, pad_token_id=0)
    act = batch.action_mask
    # each turn's reward on its own last action token, the rows' rewards summing to the trajectories'
    for r, t in enumerate(trajs):
        pos, last = 0, []
        for seg in t.segments:
            pos += len(seg.token_ids)
            if seg.kind == "action":
                last.append(pos - 1)
        nz = torch.nonzero(batch.rewards[r]).flatten().tolist()
        assert set(nz) <= set(last) and abs(float(batch.rewards[r].sum()) - t.reward) < 1e-6
        assert all(bool(act[r, p]) for p in last)
    # advantages through the learner's own GAE (its config: skip-observation GAE, length-adaptive lambda)
    stub = SimpleNamespace(cfg=cfg, adv_fn=get_advantage("skip_obs_gae"), adv_traits=advantage_traits("skip_obs_gae"))
    raw = torch.rand(batch.shape)
    values = shifted_values(raw) * batch.response_mask
    adv, _ = Learner._gae(stub, batch, values, value_after(raw, batch))  # type: ignore[arg-type]
    assert torch.all(adv[~act] == 0)
    truncated = [r for r, t in enumerate(trajs) if t.status == "truncated"]
    assert truncated, [t.status for t in trajs]
    # the SWE env grades the repository whenever an episode ends: every cut is graded, its return complete
    assert all(trajs[r].info.get("graded") is True for r in truncated) and not bool(batch.bootstrap.any())
    # the context budget's one rule, in real episodes: within it, and a budget cut ends on an action
    for t in trajs:
        assert t.num_tokens <= budget
        if t.info.get("truncation_reason") == "context_length":
            assert t.segments[-1].kind == "action"
    for r in range(len(trajs)):
        p = int(torch.nonzero(act[r]).flatten()[-1])
        # A at the last action token = r - V: V after a complete return is 0, a graded cut included
        assert abs(float(adv[r, p]) - (float(batch.rewards[r, p]) - float(values[r, p]))) < 1e-5
    # the DIS loss (the run's band) gives observation and prompt tokens no gradient, action tokens some
    logp = (batch.rollout_logprobs - 0.01).clone().requires_grad_(True)
    lo, hi = cfg.dis_bounds
    assert (lo, hi) == (0.8, 3.0)  # the coding band: keep r in (0.2, 4.0)
    advantages = torch.where(act, torch.randn(batch.shape), 0.0)
    loss, _ = get_policy_loss("dis")(
        PolicyLossInputs(logp=logp, rollout_logp=batch.rollout_logprobs, advantages=advantages, action_mask=act,
                         eps_low=lo, eps_high=hi)
    )  # fmt: skip
    loss.backward()
    assert logp.grad is not None and torch.all(logp.grad[~act] == 0) and bool(torch.any(logp.grad[act] != 0))
    # the policy step moved the weights it started from
    before = load_file(str(start_model / "model.safetensors"))
    after = load_file(str(train / "final" / "actor" / "model.safetensors"))
    shared = [k for k in after if k in before]  # the saved actor also writes the tied lm_head the hub file omits
    assert len(shared) == len(before)
    assert any(not torch.equal(before[k], after[k]) for k in shared)


@pytest.mark.parametrize(
    ("size", "rows"),
    [pytest.param(ONE_ROW, 1, id="smoke"), pytest.param(TWO_ROWS, 2, id="job_settings", marks=pytest.mark.full)],
)
def test_swe_job_trains_sao_on_docker_swe_rollouts(
    size: list[str], rows: int, tmp_path: Path, smollm2_dir: Path, offline_tasks: Any
) -> None:
    run = tmp_path / "swe"
    t0 = time.time()
    res = subprocess.run(
        [sys.executable, "-m", "sao.cli.main", "train", str(ROOT / "configs/swe_quickstart.yaml"), f"run.dir={run}",
         *SMOKE, *size],
        cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=2400,
    )  # fmt: skip
    wall = time.time() - t0
    assert res.returncode == 0, res.stderr[-4000:]
    collected = json.loads((run / "00_collect" / "done.json").read_text())
    assert collected["episodes"] == 2 and collected["infra_errors"] == 0  # the demonstrator's calls ran in Docker
    check_what_the_trainer_consumed(run / "01_train", smollm2_dir, budget=1400, rows=rows)
    print(f"SWE job smoke wall time {wall:.0f}s")
