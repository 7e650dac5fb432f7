"""Scan kernels (trainer/algos/scan.py) against plain loops: reverse linear scan and dense skip-observation GAE."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sao.trainer.algos import scan
from sao.trainer.algos.reference import skip_observation_gae_loop
from sao.trainer.algos.scan import dense_supported, masked_gae_dense, reverse_linear_scan

FAST = settings(max_examples=60, deadline=None)
# coefficients the dense path accepts: c = gamma * lam >= 0.05 and lam >= 0.05, 1.0 included
dense_coeffs = st.tuples(st.one_of(st.just(1.0), st.floats(0.25, 1.0)), st.one_of(st.just(1.0), st.floats(0.2, 1.0)))


def _scan_loop(x: list[float], a: list[float]) -> list[float]:
    out, acc = [0.0] * len(x), 0.0
    for q in reversed(range(len(x))):
        acc = x[q] + a[q] * acc
        out[q] = acc
    return out


@FAST
@given(st.integers(1, 4), st.integers(0, 70), st.integers(0, 2**31), st.floats(0.0, 0.5))
def test_reverse_linear_scan_matches_loop(g: int, q: int, seed: int, reset_frac: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(g, q, generator=gen, dtype=torch.float64)
    a = torch.rand(g, q, generator=gen, dtype=torch.float64)
    a[torch.rand(g, q, generator=gen) < reset_frac] = 0.0  # resets
    a[torch.rand(g, q, generator=gen) < 0.2] = 1.0  # no decay
    x0, a0 = x.clone(), a.clone()
    got = reverse_linear_scan(x, a)
    ref = torch.tensor([_scan_loop(xr, ar) for xr, ar in zip(x.tolist(), a.tolist(), strict=True)], dtype=x.dtype)
    torch.testing.assert_close(got, ref.view(g, q), rtol=1e-12, atol=1e-12)
    assert torch.equal(x, x0) and torch.equal(a, a0)  # inputs untouched (the scan works on copies)


def test_reverse_linear_scan_shape_mismatch() -> None:
    with pytest.raises(ValueError, match="one shape"):
        reverse_linear_scan(torch.zeros(2, 3), torch.zeros(2, 4))


@st.composite
def dense_case(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, float, int]:
    b = draw(st.integers(1, 5))
    t = draw(st.integers(1, 90))
    kind = draw(st.sampled_from(["random", "blocks", "all", "none", "one"]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    if kind == "random":
        mask = torch.rand(b, t, generator=gen) < draw(st.floats(0.0, 1.0))
    elif kind == "blocks":  # long action / observation runs, so chunks with no action token at all occur
        mask = (torch.arange(t) // draw(st.integers(1, 20))) % 2 == 0
        mask = mask.expand(b, t).clone()
    elif kind == "all":
        mask = torch.ones(b, t, dtype=torch.bool)
    elif kind == "none":
        mask = torch.zeros(b, t, dtype=torch.bool)
    else:  # one action token per row
        mask = torch.zeros(b, t, dtype=torch.bool)
        mask[torch.arange(b), torch.randint(0, t, (b,), generator=gen)] = True
    rewards = torch.randn(b, t, generator=gen, dtype=torch.float64)
    values = torch.randn(b, t, generator=gen, dtype=torch.float64)
    gamma, lam = draw(dense_coeffs)
    return rewards, values, mask, gamma, lam, draw(st.sampled_from([1, 2, 4, 16]))


@FAST
@given(dense_case())
def test_dense_gae_matches_loop(case: tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, float, int]) -> None:
    rewards, values, mask, gamma, lam, chunk = case
    assert dense_supported(gamma, lam)
    adv, ret = masked_gae_dense(rewards, values, mask, gamma, lam, chunk=chunk)
    ref_adv, ref_ret = skip_observation_gae_loop(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(adv, ref_adv, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ret, ref_ret, rtol=1e-9, atol=1e-9)
    assert bool((adv[~mask] == 0).all()) and bool((ret[~mask] == 0).all())


@pytest.mark.parametrize(("gamma", "lam", "tile"), [(1.0, 1.0, 1 << 16), (0.99, 0.95, 1), (0.5, 0.3, 1500)])
def test_dense_gae_float32_long_rows(gamma: float, lam: float, tile: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scan, "_TILE_TOKENS", tile)  # one tile, one row per tile, two rows per tile
    gen = torch.Generator().manual_seed(3)
    mask = torch.rand(4, 700, generator=gen) < 0.6
    rewards = torch.randn(4, 700, generator=gen) * 0.1
    values = torch.randn(4, 700, generator=gen)
    adv, ret = masked_gae_dense(rewards, values, mask.int(), gamma, lam)  # 0/1 int mask works too
    assert adv.dtype == torch.float32
    ref_adv, ref_ret = skip_observation_gae_loop(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(adv.double(), ref_adv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret.double(), ref_ret, rtol=1e-5, atol=1e-5)


def test_dense_gae_leaves_float_mask_untouched() -> None:
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0, 0.0]])
    before = mask.clone()
    masked_gae_dense(torch.ones(1, 5), torch.ones(1, 5), mask, 0.9, 0.9, chunk=2)
    assert torch.equal(mask, before)


def test_dense_gae_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="gamma\\*lam"):
        masked_gae_dense(torch.zeros(1, 3), torch.zeros(1, 3), torch.ones(1, 3), 0.0, 0.9)
    with pytest.raises(ValueError, match="one shape"):
        masked_gae_dense(torch.zeros(1, 3), torch.zeros(1, 4), torch.ones(1, 3), 0.9, 0.9)
    assert not dense_supported(0.9, 0.01) and dense_supported(1.0, 1.0)


def test_dense_gae_takes_column_slices() -> None:
    """Micro batches cut by a token budget are column slices of the batch (not contiguous): a length that is a
    multiple of the chunk used to fail with "view size is not compatible" (seen in value pretraining)."""
    from sao.trainer.algos.scan import masked_gae_dense

    g = torch.Generator().manual_seed(0)
    wide_r, wide_v = torch.rand(3, 96, generator=g), torch.rand(3, 96, generator=g)
    wide_m = torch.rand(3, 96, generator=g) > 0.4
    r, v, m = wide_r[:, :64], wide_v[:, :64], wide_m[:, :64]
    assert not r.is_contiguous()
    got = masked_gae_dense(r, v, m, 0.99, 0.9, chunk=32)
    want = masked_gae_dense(r.contiguous(), v.contiguous(), m.contiguous(), 0.99, 0.9, chunk=32)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
