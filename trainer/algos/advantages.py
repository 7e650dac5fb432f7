"""Advantage estimators: skip-observation GAE, token GAE, GRPO group normalisation, a running-mean baseline;
VAPO's length-adaptive lambda.

Shapes: ``B`` rows, ``T`` tokens. Masks may be bool or 0/1. Every estimator returns ``(advantages, returns)``
as ``[B, T]`` float tensors that are exactly 0 off the tokens it covers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch

from sao.trainer.algos.scan import dense_supported, masked_gae_dense
from sao.trainer.algos.tables import AdvantageFn, AdvantageInputs, register_advantage

# Chunk width of the blocked reverse scan: the per-chunk work is a [L/C, C] x [C, C] matmul and the carry
# between chunks the same scan on L/C heads, so Python only recurses log_C(L) times.
_CHUNK = 32


def _check_gamma_lam(gamma: float, lam: float) -> None:
    for name, x in (("gamma", gamma), ("lam", lam)):
        if not (0.0 <= float(x) <= 1.0):
            raise ValueError(f"{name} must be in [0, 1], got {x!r}")


def _check_same_shape(**tensors: torch.Tensor) -> tuple[int, int]:
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    first = next(iter(shapes.values()))
    if len(first) != 2 or any(s != first for s in shapes.values()):
        raise ValueError(f"expected [B, T] tensors of one shape, got {shapes}")
    return first[0], first[1]


def _discounted_reverse_cumsum(x: torch.Tensor, c: float) -> torch.Tensor:
    """``y[:, k] = sum_{j >= k} c**(j - k) * x[:, j]`` for a ``[G, L]`` float tensor, without a Python loop.

    Blocked scan: inside each chunk of width C the sum is a matmul with the upper-triangular matrix of powers
    ``c**(j - k)``; the chunk heads then obey the same recursion with factor ``c**C`` (solved by recursing on
    the ``[G, L/C]`` heads), and each token adds ``c**(C - k)`` times the next chunk's head. All powers are <= 1, so
    nothing overflows; terms far apart underflow to 0, which is their true value to the dtype's precision.
    """
    g, n = x.shape
    if n == 0:
        return x.clone()
    width = min(_CHUNK, n)
    nc = -(-n // width)
    xp = (x if nc * width == n else torch.nn.functional.pad(x, (0, nc * width - n))).view(g, nc, width)
    ar = torch.arange(width, device=x.device, dtype=x.dtype)
    diff = ar[None, :] - ar[:, None]  # diff[k, j] = j - k
    inner = torch.where(diff >= 0, torch.pow(c, diff.clamp(min=0)), 0.0)  # c**0 == 1 even for c == 0
    local = xp @ inner.T  # local[., i, k] = sum_{j >= k in chunk i} c**(j-k) x[j]
    if nc > 1:
        # the chunk heads follow the same recursion with factor c**C: recurse (depth log_C(L), memory O(G*L))
        heads = _discounted_reverse_cumsum(local[:, :, 0].contiguous(), c**width)
        nxt = torch.nn.functional.pad(heads[:, 1:], (0, 1))  # head of the following chunk, 0 after the last
        local = local + torch.pow(c, width - ar)[None, None, :] * nxt[:, :, None]
    out = local.reshape(g, nc * width)
    return out if nc * width == n else out[:, :n].contiguous()


def _compact_index(mask: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """Where each masked token goes in a compact ``[B, W]`` table of rows x masked-token rank.

    ``W`` is the most masked tokens in one row plus at least one spare column, rounded up to the scan's chunk
    width, so every row ends in zero padding and the table's last slot is never a real token: unmasked tokens all
    point there (the dump slot). Returns ``(flat_index [B*T], B, W)``. Built from a row cumsum (no ``nonzero``).
    """
    b, t = mask.shape
    count = torch.cumsum(mask, 1, dtype=torch.int32)  # inclusive number of masked tokens so far in the row
    length = int(count[:, -1].max()) if b and t else 0
    width = -(-(length + 1) // _CHUNK) * _CHUNK
    # int32 indices when they fit: on CPU the int64 [B, T] passes cost several times more than the int32 ones
    index_dtype = torch.int32 if b * width < 2**31 else torch.int64
    fi = count.to(index_dtype) + (torch.arange(b, device=mask.device, dtype=index_dtype) * width - 1)[:, None]
    fi = torch.where(mask, fi, b * width - 1)
    return fi.view(-1), b, width


def _bootstrap(
    rewards: torch.Tensor, mask: torch.Tensor, bootstrap_values: torch.Tensor | None, gamma: float
) -> torch.Tensor:
    """Rewards with ``gamma * bootstrap_values[b]`` added on the last masked token of every row ``b``.

    ``bootstrap_values`` (``[B]``) is V of the state after each row's last token for an episode whose return is
    incomplete (a cut nothing graded), and 0 for a complete one. Bootstrapping makes that token's
    ``delta = r + gamma * V(after) - V(last)``, which is exactly this reward shift with V = 0 after the last token.
    """
    if bootstrap_values is None:
        return rewards
    b, t = rewards.shape
    if tuple(bootstrap_values.shape) != (b,):
        raise ValueError(
            f"bootstrap_values must be [B] = [{b}] (one value per row), got {tuple(bootstrap_values.shape)}"
        )
    m = mask.bool()
    boot = bootstrap_values.detach().to(m.device)
    rows = (boot != 0) & m.any(dim=1)
    if not bool(rows.any()):
        return rewards
    last = t - 1 - torch.flip(m, dims=[1]).to(torch.int8).argmax(dim=1)  # the last masked column of each row
    r = rewards.clone().to(torch.promote_types(rewards.dtype, boot.dtype))
    idx = torch.arange(b, device=r.device)[rows]
    r[idx, last[rows]] += gamma * boot[rows].to(r.dtype)
    return r


def _masked_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    bootstrap_values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over the masked tokens only, each row's masked tokens treated as consecutive steps; V after a row's last
    masked token is ``bootstrap_values[row]`` (see ``_bootstrap``), 0 when None.

    The masked tokens of every sequence are scattered into a compact zero-padded ``[G, W]`` table, the
    recursion runs there, and the result is gathered back: memory is O(B*T), and tokens off the mask can
    neither receive nor pass on anything.
    """
    b, t = _check_same_shape(rewards=rewards, values=values, action_mask=mask)
    _check_gamma_lam(gamma, lam)
    out_dtype = torch.promote_types(values.dtype, torch.float32)
    rewards, values = rewards.detach(), values.detach()  # advantages and returns are targets: no gradient
    rewards = _bootstrap(rewards, mask, bootstrap_values, gamma)
    if dense_supported(gamma, lam):
        # no compaction needed: the chunked dense scan is several times faster (see trainer/algos/scan.py)
        return masked_gae_dense(rewards, values, mask, gamma, lam)
    m = mask.bool()
    fi, n_groups, width = _compact_index(m)
    if n_groups == 0:
        zeros = torch.zeros(b, t, dtype=out_dtype, device=values.device)
        return zeros, zeros.clone()
    size = n_groups * width
    rc = torch.zeros(size, dtype=out_dtype, device=values.device).scatter_(0, fi, rewards.to(out_dtype).reshape(-1))
    vc = torch.zeros(size, dtype=out_dtype, device=values.device).scatter_(0, fi, values.to(out_dtype).reshape(-1))
    rc[-1] = 0.0  # the dump slot took every unmasked token's value
    vc[-1] = 0.0
    rc, vc = rc.view(n_groups, width), vc.view(n_groups, width)
    # V after a sequence's last masked token is 0: the table is zero-padded past it (W > most masked tokens).
    delta = torch.empty_like(rc)
    torch.add(rc[:, :-1], vc[:, 1:], alpha=gamma, out=delta[:, :-1])
    delta[:, :-1] -= vc[:, :-1]
    delta[:, -1] = 0.0
    adv_c = _discounted_reverse_cumsum(delta, gamma * lam)  # 0 on every padding slot, the dump slot included
    both = torch.stack((adv_c, adv_c + vc)).view(2, -1)
    # one index_select reads both tables (index_select, not gather: the same read, ~3x faster on CPU)
    out = both.index_select(1, fi)
    return out[0].view(b, t), out[1].view(b, t)


def skip_observation_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    action_mask: torch.Tensor,
    gamma: float,
    lam: float,
    bootstrap_values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over action tokens only: observation, prompt and padding tokens are skipped, never bootstrapped through.

    For consecutive action tokens ``t`` and ``t'`` (``t'`` the next ACTION token of the row, however many
    observation tokens lie between): ``delta_t = r_t + gamma * V(t') - V(t)`` and
    ``A_t = delta_t + gamma * lam * A_t'``; after the last action token ``A = 0`` and ``V = 0`` (the episode's
    return is complete), or ``V = bootstrap_values[row]`` (``[B]``: V of the state after the row's last action,
    for a cut nothing graded; 0 on complete rows).
    ``returns = advantages + values`` on action tokens. Both outputs are ``[B, T]``, 0 off the action tokens, in
    ``values``' dtype promoted to at least float32. Raises ValueError on mismatched shapes or gamma/lam outside
    [0, 1].
    """
    return _masked_gae(rewards, values, action_mask, gamma, lam, bootstrap_values)


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
    bootstrap_values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Standard token GAE over every response token (actions and observations alike), for the ablation.

    Same recursion as ``skip_observation_gae`` but it steps through observation tokens and bootstraps from
    their values; only the prompt and padding (``response_mask == 0``) are outside it. V after a row's last
    response token is ``bootstrap_values[row]`` (0 when None).
    """
    return _masked_gae(rewards, values, response_mask, gamma, lam, bootstrap_values)


def length_adaptive_lambda(action_tokens: int, alpha: float) -> float:
    """VAPO's length-adaptive lambda for the policy: ``1 - 1 / (alpha * n)`` for ``n`` action tokens, in [0, 1]:
    long sequences get a lambda near 1 (less bias where the critic's error compounds over many steps)."""
    if not alpha > 0:
        raise ValueError(f"length-adaptive lambda needs alpha > 0, got {alpha!r}")
    return min(max(1.0 - 1.0 / (alpha * max(action_tokens, 1)), 0.0), 1.0)


def row_lambdas(action_mask: torch.Tensor, alpha: float) -> list[float]:
    """``length_adaptive_lambda`` of each row of a ``[B, T]`` action mask."""
    return [length_adaptive_lambda(int(n), alpha) for n in action_mask.bool().sum(dim=1).tolist()]


def advantages_per_row_lambda(
    fn: AdvantageFn, inputs: AdvantageInputs, lambdas: list[float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``fn``'s advantages and returns with row ``i`` computed at ``lambdas[i]`` (rows sharing a lambda share one
    call)."""
    if len(lambdas) != inputs.rewards.shape[0]:
        raise ValueError(f"need one lambda per row: {len(lambdas)} lambdas for {inputs.rewards.shape[0]} rows")
    adv: torch.Tensor | None = None
    ret: torch.Tensor | None = None
    for lam in sorted(set(lambdas)):
        rows = torch.tensor([i for i, x in enumerate(lambdas) if x == lam], dtype=torch.long)
        a, r = fn(_select_rows(inputs, rows, lam))
        if adv is None or ret is None:
            adv = torch.zeros((inputs.rewards.shape[0], *a.shape[1:]), dtype=a.dtype, device=a.device)
            ret = torch.zeros_like(adv)
        adv[rows.to(a.device)] = a
        ret[rows.to(a.device)] = r.to(ret.dtype)
    assert adv is not None and ret is not None  # lambdas is non-empty: B >= 1
    return adv, ret


def _select_rows(inputs: AdvantageInputs, rows: torch.Tensor, lam: float) -> AdvantageInputs:
    def pick(x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else x.index_select(0, rows.to(x.device))

    return dataclasses.replace(
        inputs,
        rewards=inputs.rewards.index_select(0, rows.to(inputs.rewards.device)),
        action_mask=inputs.action_mask.index_select(0, rows.to(inputs.action_mask.device)),
        values=pick(inputs.values),
        response_mask=pick(inputs.response_mask),
        group_ids=pick(inputs.group_ids),
        episode_ids=pick(inputs.episode_ids),
        bootstrap_values=pick(inputs.bootstrap_values),
        lam=lam,
    )


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    eps: float = 1e-6,
    scale_by_std: bool = True,
) -> torch.Tensor:
    """Group-normalised outcome advantages: ``(R_i - mean_g) / (std_g + eps)`` over each prompt group ``g``.

    ``rewards`` and ``group_ids`` are ``[B]``. ``std`` is the unbiased sample std; a group of one has advantage
    0 (nothing to compare with). ``scale_by_std=False`` gives the mean-only (Dr. GRPO) variant.
    """
    if rewards.dim() != 1 or tuple(group_ids.shape) != tuple(rewards.shape):
        raise ValueError(
            f"grpo_advantages wants [B] rewards and [B] group_ids, got {tuple(rewards.shape)} and "
            f"{tuple(group_ids.shape)}"
        )
    r = rewards.double()
    _, inv = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inv.max().item()) + 1 if inv.numel() else 0
    count = torch.zeros(n_groups, dtype=torch.float64, device=r.device).index_add_(0, inv, torch.ones_like(r))
    mean = torch.zeros_like(count).index_add_(0, inv, r) / count
    centred = r - mean[inv]
    adv = centred
    if scale_by_std:
        sq = torch.zeros_like(count).index_add_(0, inv, centred**2)
        std = torch.sqrt(sq / (count - 1).clamp(min=1))
        adv = centred / (std[inv] + eps)
    adv = torch.where(count[inv] > 1, adv, torch.zeros_like(adv))
    return adv.to(torch.promote_types(rewards.dtype, torch.float32))


class RunningMeanBaseline:
    """A reward baseline without a critic: advantage = outcome reward - running mean of past outcome rewards.

    ``decay=None`` keeps the exact mean of every reward seen; ``decay in (0, 1)`` an exponential moving average.
    Before any update the baseline is the mean of the batch being scored. Call ``advantage`` then ``update``
    (the registry entry ``running_mean`` does both); ``state_dict``/``load_state_dict`` make it resumable.

    ``keys`` (one per reward, e.g. each episode's level: ``trainer.baseline_key``) keep one mean per key as well:
    a reward is then scored against its key's mean, or the mean over all keys while its key has none yet. The mean
    over all keys (``mean``) is kept either way.
    """

    def __init__(self, decay: float | None = None) -> None:
        if decay is not None and not (0.0 < decay < 1.0):
            raise ValueError(f"RunningMeanBaseline decay must be in (0, 1) or None, got {decay!r}")
        self.decay = decay
        self.mean = 0.0
        self.count = 0
        self.by_key: dict[str, tuple[float, int]] = {}  # key -> (mean, count)

    def advantage(self, rewards: torch.Tensor, keys: Sequence[str] | None = None) -> torch.Tensor:
        """``[B]`` outcome rewards -> ``[B]`` advantages against the current baseline (no state change)."""
        base = self.mean if self.count > 0 else (float(rewards.double().mean()) if rewards.numel() else 0.0)
        out = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
        if keys is None:
            return out - base
        _same_length(rewards, keys)
        per_row = [self.by_key[k][0] if k in self.by_key else base for k in keys]
        return out - torch.tensor(per_row, dtype=out.dtype, device=out.device)

    def update(self, rewards: torch.Tensor, keys: Sequence[str] | None = None) -> None:
        vals = rewards.detach().double().flatten().tolist()
        if keys is not None:
            _same_length(rewards, keys)
        for i, x in enumerate(vals):
            if not math.isfinite(x):
                raise ValueError(f"RunningMeanBaseline.update got a non-finite reward {x!r}")
            self.mean, self.count = self._step(self.mean, self.count, x)
            if keys is not None:
                self.by_key[keys[i]] = self._step(*self.by_key.get(keys[i], (0.0, 0)), x)

    def _step(self, mean: float, count: int, x: float) -> tuple[float, int]:
        if self.decay is None or count == 0:
            return mean + (x - mean) / (count + 1), count + 1
        return self.decay * mean + (1.0 - self.decay) * x, count + 1

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "mean": self.mean, "count": self.count, "by_key": dict(self.by_key)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.decay = state["decay"]
        self.mean = float(state["mean"])
        self.count = int(state["count"])
        self.by_key = {str(k): (float(m), int(c)) for k, (m, c) in state.get("by_key", {}).items()}


def _same_length(rewards: torch.Tensor, keys: Sequence[str]) -> None:
    if len(keys) != rewards.numel():
        raise ValueError(f"RunningMeanBaseline: {len(keys)} keys for {rewards.numel()} rewards; pass one key a reward")


def _outcome(inputs: AdvantageInputs) -> torch.Tensor:
    """Per-row outcome reward: the sum of the row's token rewards (final + per-turn)."""
    return inputs.rewards.sum(dim=-1)


def _episodes(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, inverse)``: one row per episode (its last: every row carries the episode's outcome) and the episode
    of each row as an index into them, so an outcome baseline counts an episode once however many rows it has."""
    b, dev = inputs.rewards.shape[0], inputs.rewards.device
    if inputs.episode_ids is None:
        return torch.arange(b, device=dev), torch.arange(b, device=dev)
    last: dict[int, int] = {}
    for row, e in enumerate(inputs.episode_ids.tolist()):
        last[int(e)] = row
    order = {e: k for k, e in enumerate(last)}
    inverse = torch.tensor([order[int(e)] for e in inputs.episode_ids.tolist()], dtype=torch.long, device=dev)
    return torch.tensor(list(last.values()), dtype=torch.long, device=dev), inverse


def _broadcast(adv_rows: torch.Tensor, outcome: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    m = mask.to(adv_rows.dtype)
    return adv_rows[:, None] * m, outcome.to(adv_rows.dtype)[:, None] * m


def _need(value: torch.Tensor | None, what: str, estimator: str) -> torch.Tensor:
    if value is None:
        raise ValueError(f"advantage estimator {estimator!r} needs {what}; pass it in AdvantageInputs")
    return value


def whiten_stats(advantages: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, float]:
    """``(count, sum, sum of squares)`` of ``advantages`` over ``mask``: the parts a trainer all-reduces across
    micro batches and ranks before ``whiten`` (float64 sums, so large batches lose nothing)."""
    m = mask.bool()
    x = advantages.detach()[m].double()
    return float(x.numel()), float(x.sum()), float((x * x).sum())


def whiten(
    advantages: torch.Tensor, mask: torch.Tensor, stats: tuple[float, float, float], min_std: float = 1e-8
) -> torch.Tensor:
    """Advantage normalisation: ``(A - mean) / max(std, min_std)`` on the masked tokens, 0 elsewhere.

    ``stats`` are the summed ``whiten_stats`` of the whole batch (population std), so every micro batch and rank
    applies the same shift and scale. A batch with fewer than 2 tokens is left unscaled (only centred).
    ``min_std`` keeps a batch whose advantages barely differ (every episode solved, an accurate critic) from being
    blown up into unit-size noise.
    """
    n, s, sq = stats
    if n < 1:
        return torch.zeros_like(advantages)
    mean = s / n
    var = max(sq / n - mean * mean, 0.0)
    scale = 1.0 / max(math.sqrt(var), min_std) if n >= 2 else 1.0
    out = (advantages - mean) * scale
    return torch.where(mask.bool(), out, torch.zeros_like(out))


@register_advantage("skip_obs_gae", needs_values=True)
def _skip_obs_gae_entry(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    values = _need(inputs.values, "critic values", "skip_obs_gae")
    return skip_observation_gae(
        inputs.rewards, values, inputs.action_mask, inputs.gamma, inputs.lam, inputs.bootstrap_values
    )


@register_advantage("gae", needs_values=True, token_level=True)
def _gae_entry(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    values = _need(inputs.values, "critic values", "gae")
    mask = inputs.response_mask if inputs.response_mask is not None else inputs.action_mask
    adv, ret = gae(inputs.rewards, values, mask, inputs.gamma, inputs.lam, inputs.bootstrap_values)
    # Observation tokens get advantages too, but the policy loss only ever reads action tokens.
    return adv, ret


@register_advantage("grpo", needs_groups=True)
def _grpo_entry(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    group_ids = _need(inputs.group_ids, "group_ids ([B] prompt group of each row)", "grpo")
    outcome = _outcome(inputs)
    rows, inverse = _episodes(inputs)  # one baseline term per episode, its advantage on every row of it
    per_episode = grpo_advantages(outcome[rows], group_ids.to(rows.device)[rows])
    return _broadcast(per_episode[inverse], outcome, inputs.action_mask)


@register_advantage("running_mean", needs_baseline=True)
def _running_mean_entry(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    if inputs.baseline is None:
        raise ValueError("advantage estimator 'running_mean' needs baseline=RunningMeanBaseline() in AdvantageInputs")
    outcome = _outcome(inputs)
    rows, inverse = _episodes(inputs)
    keys = None if inputs.baseline_keys is None else [inputs.baseline_keys[r] for r in rows.tolist()]
    adv = inputs.baseline.advantage(outcome[rows], keys)
    inputs.baseline.update(outcome[rows], keys)
    return _broadcast(adv[inverse], outcome, inputs.action_mask)


def turn_sign_stats(advantages: torch.Tensor, action_mask: torch.Tensor, rewards: torch.Tensor) -> list[float]:
    """Whether the advantages point the way the outcome does, turn by turn: ``[turns of solved rows with a
    positive mean advantage, turns of solved rows, turns of failed rows with a negative mean advantage, turns of
    failed rows]``. A turn is one run of action tokens; a row is solved when its rewards sum above 0. Sums, so a
    trainer all-reduces them across micro batches and ranks. Low agreement with a critic (worse than a constant)
    says its advantages push solved turns down and failed turns up."""
    m = action_mask.bool()
    start = m.clone()
    start[:, 1:] &= ~m[:, :-1]  # a turn's first action token
    n = int(start.sum())
    if n == 0:
        return [0.0, 0.0, 0.0, 0.0]
    # turn k (row-major order) owns ids k; 0 collects every non-action token and is dropped
    ids = (torch.cumsum(start.flatten().long(), 0) * m.flatten().long()).view(-1)
    adv = advantages.detach().float().flatten() * m.flatten()
    sums = torch.zeros(n + 1).index_add_(0, ids, adv)[1:]
    solved = (rewards.detach().float().sum(dim=1) > 0.0)[torch.nonzero(start)[:, 0]]
    return [float((solved & (sums > 0)).sum()), float(solved.sum()),
            float((~solved & (sums < 0)).sum()), float((~solved).sum())]  # fmt: skip
