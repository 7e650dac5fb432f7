"""`sao pretrain-value`: trains only the critic on saved trajectories and writes a checkpoint critic.init loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from agent.records import write_jsonl
from tests.integration.trainer._helpers import synthetic_trajectories

pytestmark = [pytest.mark.deepspeed]


def test_pretrained_critic_is_loadable_and_fits_the_returns(
    tmp_path: Path, deepspeed_env: dict[str, str], smollm2_dir: Path
) -> None:
    from saocore.tiny_models import build_tiny_model
    from trainer.config import load_config
    from trainer.models import load_actor, load_critic
    from trainer.value_pretrain import pretrain_value

    rollouts = tmp_path / "rollouts.jsonl"
    write_jsonl(rollouts, synthetic_trajectories(build_tiny_model("llama"), 16))
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(
        yaml.safe_dump(
            {
                "run": {"dir": str(tmp_path / "run")},
                "model": {"path": "tiny:llama"},
                "critic": {"lr": 3e-3},
                "trainer": {"batch_size": 8},
                "deepspeed": {"micro_batch_size": 4},
            }
        )
    )
    out = pretrain_value(str(cfg_path), str(rollouts), epochs=3)
    assert (out / "value_head.safetensors").exists() and (out / "config.json").exists()
    cfg = load_config(cfg_path, [f"critic.init={out}"])
    fresh_cfg = load_config(cfg_path)
    actor = load_actor(fresh_cfg)
    loaded, fresh = load_critic(cfg, actor), load_critic(fresh_cfg, actor)
    assert not torch.equal(loaded.value_head.weight, fresh.value_head.weight)
    # The attention weights were frozen during pretraining: they still equal the actor's.
    a = dict(actor.named_parameters())
    for name, p in loaded.named_parameters():
        if ".self_attn." in name:
            assert torch.equal(p, a["model." + name[len("backbone.") :]]), name
