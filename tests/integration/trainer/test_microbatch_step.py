"""Token-budget micro batches on real DeepSpeed: a learner step whose micro batches are sorted, cut by a token budget
and padded to their own longest row applies the same gradients as one unsorted, unsplit micro batch, with one
optimizer step per engine, on one rank and on two ranks that need an empty micro batch to stay in step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from sao.trainer.learn.batch import micro_rows
from tests.conftest import cli_env, free_port
from tests.integration.trainer._microbatch_worker import SHAPES, K, step_gradients

pytestmark = [pytest.mark.deepspeed]

ROOT = Path(__file__).resolve().parents[3]
BUDGET = 70


def _assert_same_steps(got: dict[str, Any], ref: dict[str, Any]) -> None:
    assert set(got["steps"]) == set(ref["steps"])
    for name, steps in ref["steps"].items():
        assert len(got["steps"][name]) == len(steps) == {"actor": 1, "critic": K}[name], f"{name}: optimizer steps"
        for g, r in zip(got["steps"][name], steps, strict=True):
            assert set(g) == set(r) and r
            for k in r:
                # float tolerance relative to the tensor's scale: Adam's first update (~lr * sign(g)) turns the
                # summation-order noise of near-zero gradients into ~1e-5 of the scale by the second critic step
                scale = float(r[k].abs().max())
                torch.testing.assert_close(
                    g[k], r[k], rtol=1e-4, atol=1e-4 * scale, msg=lambda m, n=f"{name} {k}": f"{n}: {m}"
                )
    assert got["trained_tokens"] == ref["trained_tokens"]


@pytest.mark.parametrize("algorithm", ["sao", "grpo"])
def test_a_token_budget_step_applies_the_unsplit_gradient(deepspeed_env: dict[str, str], algorithm: str) -> None:
    lengths = [sum(s) for s in SHAPES]
    assert len(micro_rows(lengths, 1, 8, BUDGET)[0]) == 3  # three micro batches against DeepSpeed's count of one
    ref = step_gradients(algorithm, micro_batch_size=8, micro_batch_tokens=0)  # one micro batch, batch order
    got = step_gradients(algorithm, micro_batch_size=8, micro_batch_tokens=BUDGET)
    _assert_same_steps(got, ref)


def test_two_ranks_with_an_empty_micro_batch_apply_the_unsplit_gradient(
    deepspeed_env: dict[str, str], tmp_path: Path
) -> None:
    plan = micro_rows([sum(s) for s in SHAPES], 2, 8, BUDGET)
    assert plan == [[[0], [3]], [[1, 2], []]]  # rank 1 runs an empty micro batch to keep the boundary in step
    out = tmp_path / "grads.pt"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
        "-m", "tests.integration.trainer._microbatch_worker", str(out), str(BUDGET),
    ]  # fmt: skip
    res = subprocess.run(cmd, env=cli_env(), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    got = torch.load(out)
    ref = step_gradients("sao", micro_batch_size=8, micro_batch_tokens=0)
    _assert_same_steps(got, ref)
