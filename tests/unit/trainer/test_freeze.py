"""Attention freezing by module type: which critic parameters get gradients, dense and MoE."""

from __future__ import annotations

import pytest
import torch

from sao.core.tiny_models import build_tiny_model
from sao.trainer.config import ConfigError, config_from_dict
from sao.trainer.learn.models import ValueModel, attention_param_names, freeze_attention, load_critic


@pytest.mark.parametrize("kind", ["llama", "moe"])
def test_only_non_attention_params_get_grads(kind: str) -> None:
    cfg = config_from_dict({"model": {"path": f"tiny:{kind}", "tiny_overrides": {"vocab_size": 256}}})
    actor = build_tiny_model(kind, vocab_size=256)
    critic = load_critic(cfg, actor)
    frozen = set(attention_param_names(critic))
    # Every q/k/v/o projection, q/k norm (MoE) and pre-attention norm is frozen; the MLP-side norm is not.
    for name, _ in critic.named_parameters():
        is_attn = ".self_attn." in name or ".input_layernorm." in name
        assert (name in frozen) == is_attn, name
    if kind == "moe":
        assert any("q_norm" in n for n in frozen)
    ids = torch.randint(0, 256, (2, 12))
    critic(ids, torch.ones_like(ids)).sum().backward()
    got = {n for n, p in critic.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert not (got & frozen)
    assert "value_head.weight" in got
    assert any("mlp" in n for n in got)
    assert any("embed_tokens" in n for n in got)
    if kind == "moe":
        assert any("mlp.gate" in n for n in got), "the router must stay trainable"


def test_model_without_attention_modules_is_refused() -> None:
    backbone = torch.nn.Sequential(torch.nn.Embedding(10, 4))
    with pytest.raises(ConfigError, match="freeze_attention=false"):
        freeze_attention(ValueModel(backbone, 4))
