"""GPU checks (marker `gpu`, never run in CI): a bf16 DeepSpeed step on CUDA and a 2-GPU NCCL run of the toy config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sao.trainer.config import config_from_dict
from tests._cli_env import cli_env
from tests.conftest import free_port
from tests.integration.trainer._helpers import synthetic_trajectories
from tests.integration.trainer.test_runs import FAST, ROOT, _steps

pytestmark = [pytest.mark.gpu, pytest.mark.deepspeed]
# The GPU machine has no deepspeed until the wheels of `bash scripts/gpu_check.sh --prepare` are installed there.
pytest.importorskip("deepspeed", reason="deepspeed is not installed: carry it as docs/gpu.md says")


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def needs_gpus(n: int) -> pytest.MarkDecorator:
    """Skip before any fixture runs (a fixture may need what a GPU machine lacks, e.g. the converted SmolLM2)."""
    return pytest.mark.skipif(_gpus() < n, reason=f"needs {n} CUDA GPU(s); found {_gpus()}")


@needs_gpus(1)
def test_bf16_sao_step_on_cuda_with_nccl(deepspeed_env: dict[str, str]) -> None:
    from sao.trainer import distributed
    from sao.trainer.learn.learner import Learner
    from sao.trainer.learn.models import load_actor, load_critic

    distributed.init_distributed()
    assert torch.distributed.get_backend() == "nccl"
    cfg = config_from_dict(
        {
            "model": {"path": "tiny:moe"},
            "trainer": {"algorithm": "sao", "batch_size": 4, "lr": 1e-3, "critic_updates_per_step": 2},
            "critic": {"lr": 1e-3},
            "deepspeed": {"micro_batch_size": 2, "bf16": True},
        }
    )
    actor = load_actor(cfg)
    critic = load_critic(cfg, actor)
    trajs = synthetic_trajectories(actor, 4)
    learner = Learner(cfg, actor, critic, pad_token_id=0)
    p = next(learner.actor.module.parameters())
    assert p.is_cuda, "the actor engine did not move to the GPU"
    before = {k: v.detach().float().clone() for k, v in learner.actor.module.named_parameters()}
    metrics = learner.train_step(trajs)
    moved = [k for k, v in learner.actor.module.named_parameters() if not torch.equal(before[k], v.detach().float())]
    assert moved, "a bf16 step on CUDA changed no actor parameter"
    assert all(torch.isfinite(torch.tensor(float(v))) for k, v in metrics.items() if isinstance(v, float))


@needs_gpus(2)
def test_two_gpus_nccl_zero3_toy_run_stays_identical(tmp_path: Path) -> None:
    pytest.importorskip("gymnasium", reason="the toy run's TokenGame env needs gymnasium, which is not installed")
    run = tmp_path / "gpu2"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
        "-m", "sao.cli.main", "train", str(ROOT / "configs/toy.yaml"), f"run.dir={run}", "run.total_steps=2",
        "deepspeed.zero_stage=3", "deepspeed.bf16=true", "run.param_digest=true", *FAST,
    ]  # fmt: skip
    res = subprocess.run(cmd, env=cli_env(), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    assert _steps(run) == [1, 2]
    d0 = json.loads((run / "param_digest/rank0.json").read_text())
    d1 = json.loads((run / "param_digest/rank1.json").read_text())
    assert d0 == d1
