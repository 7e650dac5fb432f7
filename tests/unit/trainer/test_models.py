"""The critic's value alignment: V at token t is the value of the prefix before t (issue 23, defect 6)."""

from __future__ import annotations

from typing import Any

import torch

from sao.core.tiny_models import build_tiny_model
from sao.trainer.learn.models import ValueModel, shifted_values


def test_shifted_values_moves_every_value_one_token_right() -> None:
    v = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    assert shifted_values(v).tolist() == [[0.0, 1.0, 2.0, 3.0]]


def test_the_value_of_a_token_does_not_see_the_token() -> None:
    # the state a token was sampled in does not contain that token: changing token t must leave V[:, t] alone
    # and change V[:, t + 1] (unshifted values fail the first half)
    lm = build_tiny_model("llama", seed=0)
    critic = ValueModel(lm.model, int(lm.config.hidden_size)).eval()
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    other = ids.clone()
    other[0, 3] = 9
    mask = torch.ones_like(ids)
    with torch.no_grad():
        a = shifted_values(critic(ids, mask))
        b = shifted_values(critic(other, mask))
    assert torch.equal(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4], b[:, 4])


def _bytes_kept_for_backward(run: Any) -> int:
    """Bytes autograd saves for backward while ``run()`` computes its output (then backward runs)."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    out.float().sum().backward()
    return total


def test_gradient_checkpointing_keeps_fewer_activations_for_backward() -> None:
    """model.gradient_checkpointing must take effect (HF checkpoints only in training mode, and a model from
    from_pretrained is in eval mode): the bytes autograd keeps for backward shrink, for actor and critic."""
    from pathlib import Path

    from sao.trainer.config import load_config
    from sao.trainer.learn.models import load_actor, load_critic

    toy = Path(__file__).resolve().parents[3] / "configs" / "toy.yaml"
    kept: dict[tuple[bool, str], int] = {}
    for on in (False, True):
        cfg = load_config(toy, [f"model.gradient_checkpointing={str(on).lower()}"])
        actor = load_actor(cfg)
        critic = load_critic(cfg, actor)
        ids = torch.randint(0, 32, (2, 64))
        outputs = {
            "actor": lambda a=actor, x=ids: a.model(input_ids=x).last_hidden_state,
            "critic": lambda c=critic, x=ids: c(x, torch.ones_like(x)),
        }
        for name, run in outputs.items():
            kept[(on, name)] = _bytes_kept_for_backward(run)
    for name in ("actor", "critic"):
        assert kept[(True, name)] < 0.6 * kept[(False, name)], kept
