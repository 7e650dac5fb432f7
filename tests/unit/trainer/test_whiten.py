"""Advantage whitening (``trainer.normalize_advantages``): batch statistics over action tokens, micro-batch safe."""

from __future__ import annotations

import torch

from sao.trainer.algos.advantages import whiten, whiten_stats


def test_whiten_gives_zero_mean_unit_std_on_masked_tokens_and_zero_elsewhere() -> None:
    adv = torch.tensor([[5.0, 1.0, 2.0, 9.0], [3.0, 7.0, 0.0, -4.0]])
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    out = whiten(adv, mask, whiten_stats(adv, mask))
    vals = out[mask].double()
    assert abs(float(vals.mean())) < 1e-6
    assert abs(float(vals.std(unbiased=False)) - 1.0) < 1e-5
    assert bool((out[~mask] == 0).all())
    # order is kept: the largest raw advantage stays the largest
    assert int(torch.argmax(out[mask])) == int(torch.argmax(adv[mask]))


def test_stats_summed_over_micro_batches_equal_the_whole_batch() -> None:
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(6, 5, generator=g)
    mask = torch.rand(6, 5, generator=g) > 0.4
    whole = whiten(adv, mask, whiten_stats(adv, mask))
    parts = [whiten_stats(adv[i : i + 2], mask[i : i + 2]) for i in range(0, 6, 2)]
    summed = (sum(p[0] for p in parts), sum(p[1] for p in parts), sum(p[2] for p in parts))
    pieces = torch.cat([whiten(adv[i : i + 2], mask[i : i + 2], summed) for i in range(0, 6, 2)])
    assert torch.allclose(whole, pieces, atol=1e-6)


def test_constant_or_single_token_batches_stay_finite() -> None:
    adv = torch.full((2, 3), 0.7)
    mask = torch.ones(2, 3, dtype=torch.bool)
    out = whiten(adv, mask, whiten_stats(adv, mask))
    assert torch.isfinite(out).all() and float(out.abs().max()) < 1e-3
    one = torch.tensor([[0.0, 2.5]])
    m1 = torch.tensor([[False, True]])
    assert whiten(one, m1, whiten_stats(one, m1)).tolist() == [[0.0, 0.0]]
    empty = torch.zeros(1, 2, dtype=torch.bool)
    assert whiten(one, empty, whiten_stats(one, empty)).abs().sum() == 0


def test_min_std_floor_keeps_near_equal_advantages_small() -> None:
    adv = torch.tensor([[0.01, -0.01, 0.02, 0.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    free = whiten(adv, mask, whiten_stats(adv, mask))
    floored = whiten(adv, mask, whiten_stats(adv, mask), min_std=0.2)
    assert float(free.abs().max()) > 1.0  # unfloored, tiny differences become unit-size
    assert float(floored.abs().max()) < 0.1
    assert torch.allclose(floored * 0.2, adv - adv.mean(), atol=1e-7)


def test_turn_signs_count_each_run_of_action_tokens_against_its_rows_outcome() -> None:
    from sao.trainer.algos.advantages import turn_sign_stats

    # row 0 solved: turns [1,2] (mean +) and [5] (mean -); row 1 failed: turns [0,1] (mean -) and [3,4] (mean +)
    action = torch.tensor([[0, 1, 1, 0, 0, 1], [1, 1, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([[9.0, 0.5, 0.1, 9.0, 9.0, -1.0], [-2.0, 1.0, 9.0, 0.5, 0.5, 0.0], [1.0] * 6])
    rewards = torch.zeros(3, 6)
    rewards[0, 5] = 1.0
    rewards[1, 4] = 0.0
    rewards[2, 0] = 1.0  # a row without action tokens counts nothing
    assert turn_sign_stats(adv, action, rewards) == [1.0, 2.0, 1.0, 2.0]
    # every sign the outcome's way
    adv[0, 5], adv[1, 3:5] = 1.0, -1.0
    assert turn_sign_stats(adv, action, rewards) == [2.0, 2.0, 2.0, 2.0]
