"""The critic's value alignment: V at token t is the value of the prefix before t (issue 23, defect 6)."""

from __future__ import annotations

import torch

from saocore.tiny_models import build_tiny_model
from trainer.models import ValueModel, shifted_values


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
