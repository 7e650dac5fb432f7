"""Scan kernels for GAE: a reverse linear recurrence and a dense chunked skip-observation GAE, no gather/scatter.

``masked_gae_dense`` computes skip-observation GAE straight on the ``[B, T]`` layout. The recursion runs over the
masked tokens only, so between two tokens ``t < j`` of a row the discount is ``c**k`` (``c = gamma * lam``) with
``k`` the number of masked tokens in ``(t, j]``. Inside a chunk of ``C`` tokens that factorises as
``c**(n_j - n_t)`` (``n`` the chunk-local inclusive masked count), so one constant ``[2C, C+1]`` matrix, applied
to the ``c**n``-weighted rewards and values of every chunk, gives each token's in-chunk sum and each chunk's
total; the chunks are joined by a reverse linear scan over the ``[B, T/C]`` chunk totals. All passes are plain
elementwise ops or one small-matrix matmul: no index tensor, no Python loop over rows or tokens.
"""

from __future__ import annotations

import math

import torch

# Chunk width: c**-C must stay far from overflow and the per-chunk matmul cheap. 16 is the fastest on AVX2 CPUs.
DENSE_CHUNK = 16
# The dense path divides by lam and scales by c**-n (n <= C): below these it falls back to the compact path.
_MIN_C = 0.05
_MIN_LAM = 0.05
# Tokens per tile of rows (see masked_gae_dense): ~6 float tiles of this size stay in a core's L2 cache.
_TILE_TOKENS = 1 << 16


def reverse_linear_scan(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """``y[..., q] = x[..., q] + a[..., q] * y[..., q + 1]`` along the last dim (``y`` after the end is 0).

    ``x`` and ``a`` share one shape ``[..., Q]``; a coefficient of 0 is a reset. Doubling (Hillis-Steele) scan:
    ``ceil(log2 Q)`` rounds of three elementwise ops, O(Q) memory. Products of coefficients in [0, 1] never
    overflow; any other finite coefficients work as long as their products stay finite.
    """
    if x.shape != a.shape:
        raise ValueError(f"reverse_linear_scan: x and a must have one shape, got {tuple(x.shape)} and {tuple(a.shape)}")
    y = x.clone()
    if x.shape[-1] <= 1:
        return y
    prod = a.clone()
    n = x.shape[-1]
    d = 1
    while d < n:
        # y[q] covers [q, q+d) and prod[q] = a[q] ... a[q+d-1]: join with the block that starts at q+d
        y[..., :-d] += prod[..., :-d] * y[..., d:]
        if 2 * d < n:
            prod[..., :-d] = prod[..., :-d] * prod[..., d:]
        d *= 2
    return y


def dense_supported(gamma: float, lam: float) -> bool:
    """Whether ``masked_gae_dense`` is exact to the dtype's precision for these coefficients."""
    return gamma * lam >= _MIN_C and lam >= _MIN_LAM


def _chunk_matrices(
    c: float, lam: float, chunk: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``log_count [C, C]`` (``n_i * log c`` is ``mask @ log_count``) and the ``[C, C]`` reward and value sums."""
    ar = torch.arange(chunk, device=device)
    le = (ar[:, None] <= ar[None, :]).to(torch.float64)  # le[j, i] = j <= i
    log_count = le * math.log(c)
    # values: -V_t for the token itself, (gamma/c - 1) V_j = (1/lam - 1) V_j for every later masked j
    w_v = (1.0 / lam - 1.0) * le.T - torch.eye(chunk, dtype=torch.float64, device=device) / lam
    return log_count.to(dtype), le.T.to(dtype), w_v.to(dtype)


def masked_gae_dense(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    chunk: int = DENSE_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Skip-observation GAE on ``[B, T]`` tensors without compaction; returns ``(advantages, returns)`` ``[B, T]``.

    Same result as the per-row loop: for consecutive masked tokens ``t < t'`` of a row
    ``A_t = r_t + gamma V_t' - V_t + gamma lam A_t'``, 0 and V = 0 after the last one, ``returns = A + V``, both
    0 off the mask. ``rewards``/``values`` float, ``mask`` bool or 0/1, all one shape; output dtype is
    ``values``' promoted to at least float32. Needs ``dense_supported(gamma, lam)`` (raises ValueError otherwise)
    and finite rewards/values everywhere (off-mask entries are multiplied by 0, and inf * 0 is NaN).
    Extra memory: a few ``[B, T]`` tensors; time: ~12 elementwise passes and one ``[B*T/C, 2C] x [2C, C+1]`` matmul.
    """
    if not dense_supported(gamma, lam):
        raise ValueError(
            f"masked_gae_dense needs gamma*lam >= {_MIN_C} and lam >= {_MIN_LAM}, got gamma={gamma}, lam={lam}"
        )
    if rewards.shape != values.shape or mask.shape != values.shape or values.dim() != 2:
        raise ValueError(
            f"expected [B, T] tensors of one shape, got {tuple(rewards.shape)}, {tuple(values.shape)}, "
            f"{tuple(mask.shape)}"
        )
    b, t = values.shape
    dtype = torch.promote_types(values.dtype, torch.float32)
    r, v = rewards.to(dtype), values.to(dtype)
    mb = mask if mask.dtype == torch.bool else mask.ne(0)
    if b * t == 0:
        return torch.zeros_like(v), torch.zeros_like(v)
    pad = -t % chunk
    if pad:
        r, v, mb = (torch.nn.functional.pad(z, (0, pad)) for z in (r, v, mb))
    nq = (t + pad) // chunk
    rows = b * nq
    log_count, w_r, w_v = _chunk_matrices(gamma * lam, lam, chunk, dtype, v.device)
    # reshape, not view: micro batches cut by a token budget are column slices (not contiguous)
    mb2, r2, v2 = mb.reshape(rows, chunk), r.reshape(rows, chunk), v.reshape(rows, chunk)
    adv = torch.empty(rows, chunk, dtype=dtype, device=v.device)
    ret = torch.empty_like(adv)  # holds c**-n_t (0 off the mask) until the second pass
    head = torch.empty(rows, dtype=dtype, device=v.device)
    decay = torch.empty_like(head)
    # Tiles of whole rows: the temporaries stay small (cache-resident, no fresh pages per call); no carry
    # crosses a tile because the recursion never crosses a row.
    step = max(1, _TILE_TOKENS // (nq * chunk)) * nq
    tiles = [slice(i, min(i + step, rows)) for i in range(0, rows, step)]
    for sl in tiles:
        mf = mb2[sl].to(dtype)
        ex = torch.exp_(mf @ log_count)  # c**n_t, n_t the chunk-local inclusive masked count
        u = ex * mf  # c**n on masked tokens, 0 elsewhere
        ru = r2[sl] * u
        vu = u.mul_(v2[sl])
        # c**n_t-scaled in-chunk sums: rewards of every masked j >= t, values as in _chunk_matrices
        torch.mm(ru, w_r, out=adv[sl]).addmm_(vu, w_v)
        # the chunk total seen from before the chunk: every term is a later one, V_0 included with 1/lam - 1
        torch.add(adv[sl, 0], vu[:, 0], alpha=1.0 / lam, out=head[sl])
        decay[sl] = ex[:, -1]  # c**N_q, N_q the chunk's masked count
        torch.div(mf, ex, out=ret[sl])
    # chunks joined right to left: X_q = Z_q + c**N_q X_{q+1}; chunk q then gets c**N_q X_{q+1}
    total = reverse_linear_scan(head.view(b, nq), decay.view(b, nq))
    carry = torch.zeros_like(total)
    carry[:, :-1] = decay.view(b, nq)[:, :-1] * total[:, 1:]
    carry2 = carry.view(rows, 1)
    for sl in tiles:
        a_t = adv[sl].add_(carry2[sl]).mul_(ret[sl])  # back from the c**n_t scaling; 0 off the mask
        torch.addcmul(a_t, v2[sl], mb2[sl], out=ret[sl])
    adv, ret = adv.view(b, nq * chunk), ret.view(b, nq * chunk)
    if pad:
        adv, ret = adv[:, :t].contiguous(), ret[:, :t].contiguous()
    return adv, ret
