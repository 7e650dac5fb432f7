"""The critic under deepspeed.bf16 (CPU): DeepSpeed casts the value head to bfloat16, its values stay float32 sums
(issue 23, defect 3)."""

from __future__ import annotations

import pytest
import torch

from sao.trainer.config import config_from_dict

pytestmark = [pytest.mark.deepspeed]


def test_values_are_not_rounded_to_bf16_under_deepspeed_bf16(deepspeed_env: dict[str, str]) -> None:
    from sao.trainer import distributed
    from sao.trainer.learn.deepspeed_engine import make_engine
    from sao.trainer.learn.models import load_actor, load_critic

    distributed.init_distributed()
    cfg = config_from_dict(
        {"model": {"path": "tiny:llama", "dtype": "bfloat16"}, "deepspeed": {"bf16": True, "micro_batch_size": 2}}
    )
    actor = load_actor(cfg)
    critic = load_critic(cfg, actor)
    engine = make_engine(critic, cfg, 1, cfg.critic.lr, 0.0)
    ids = torch.randint(0, 200, (2, 24))
    with torch.no_grad():
        values = engine(ids, torch.ones_like(ids))
    assert values.dtype == torch.float32
    # a bf16 head's output is always a bf16 number; a float32 one almost never is
    rounded = values.bfloat16().float()
    assert float((values != rounded).float().mean()) > 0.5, "the critic's values were rounded to bfloat16"
