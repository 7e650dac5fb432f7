"""The value head's ridge fit (``ridge_head``): least squares on features, the penalty chosen out of fold."""

from __future__ import annotations

import pytest
import torch

from sao.trainer.learn.value_pretrain import RIDGE_PENALTIES, HeadStats, ridge_head


def _stats(x: torch.Tensor, y: torch.Tensor, folds: int = 4) -> HeadStats:
    st = HeadStats(x.shape[1], folds)
    for k, idx in enumerate(torch.arange(x.shape[0]).chunk(folds)):
        st.add(k, x[idx], y[idx])
    return st


def test_ridge_head_recovers_a_linear_value_and_beats_the_constant_out_of_fold() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 6, generator=g)
    w = torch.tensor([0.5, -0.2, 0.0, 0.1, 0.3, 0.0])
    y = x @ w + 0.4
    res = ridge_head(_stats(x, y))
    assert res["weight"].shape == (6,)
    assert torch.allclose(res["weight"], w, atol=1e-2) and res["bias"] == pytest.approx(0.4, abs=1e-2)
    assert res["penalty"] == min(RIDGE_PENALTIES)  # noiseless: the least shrinkage fits best
    assert res["cv_mse"] < 1e-3 < res["mean_mse"]


def test_ridge_head_on_features_that_hold_nothing_shrinks_to_the_mean() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, 30, generator=g)  # few positions, many features, targets unrelated to them
    y = (torch.rand(40, generator=g) < 0.3).double()
    res = ridge_head(_stats(x, y))
    assert res["penalty"] == max(RIDGE_PENALTIES)  # the strongest penalty: least overfit out of fold
    assert float(res["weight"].abs().max()) < 0.05
    assert res["bias"] == pytest.approx(float(y.mean()), abs=0.05)


def test_ridge_head_needs_two_folds_of_data() -> None:
    st = HeadStats(3, 4)
    st.add(0, torch.randn(5, 3), torch.zeros(5))
    with pytest.raises(ValueError, match="at least two folds"):
        ridge_head(st)
