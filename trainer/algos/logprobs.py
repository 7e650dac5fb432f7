"""Token logprobs and entropies from final hidden states without a ``[B, T, V]`` float32 tensor.

``logp[b, t] = log softmax(lm_head(hidden[b, t - 1]) / temperature)[input_ids[b, t]]`` (0 at ``t = 0``), and the
entropy of the same next-token distribution. The naive form projects every position at once: at a 65k context and
a 151k vocabulary its logits, log-softmax and probabilities are ~40 GB each. Here the positions are cut into chunks
of ``chunk_tokens`` rows; each chunk is projected, reduced to two numbers per token and dropped, and its backward
recomputes the projection (activation checkpointing). Peak extra memory is a few ``chunk_tokens x V`` float32
blocks whatever ``B * T``; what is kept for backward is the hidden states (``B * T * H``) and two floats per token.

The per-chunk math is one function, :func:`chunk_logprobs`, used by both forms, so the values are the same to the
bit and the gradients differ only by summation order (tested, fp32 and bf16, w.r.t. the hidden states and the
lm_head weight).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

Projection = Callable[[torch.Tensor], torch.Tensor]
"""``[N, H] -> [N, V]`` logits (the LM head: a module or ``lambda h: h @ weight.T``)."""


def chunk_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    allowed: torch.Tensor | None = None,
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[N, V]`` logits (any dtype) and ``[N]`` target ids -> float32 ``logp [N]`` and ``entropy [N]`` (or None).

    ``allowed`` (1-D ids): the policy is the softmax over those logits alone, the distribution a sampler restricted
    to them draws from; ``targets`` are then indices into ``allowed``. ``entropy_grad`` False detaches the entropy
    (a metric); True keeps its gradient (an entropy bonus in the loss).
    """
    z = logits.float()
    if allowed is not None:
        z = z.index_select(-1, allowed)
    if temperature != 1.0:
        z = z / temperature
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return logp, None
    lp = logp_all if entropy_grad else logp_all.detach()
    p = lp.exp()
    # p * log p is 0 where p underflows to 0 (log p = -inf there would give NaN).
    ent = -(p * torch.where(p > 0, lp, torch.zeros((), dtype=lp.dtype, device=lp.device))).sum(-1)
    return logp, ent


def _check(
    hidden: torch.Tensor,
    input_ids: torch.Tensor,
    temperature: float,
    chunk_tokens: int | None,
    positions: torch.Tensor | None,
) -> None:
    if hidden.dim() != 3 or tuple(hidden.shape[:2]) != tuple(input_ids.shape):
        raise ValueError(
            f"hidden must be [B, T, H] matching input_ids [B, T] = {tuple(input_ids.shape)}, got {tuple(hidden.shape)}"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if chunk_tokens is not None and chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1 (or None for the unchunked form), got {chunk_tokens!r}")
    if positions is not None and tuple(positions.shape) != tuple(input_ids.shape):
        raise ValueError(f"positions must be [B, T] like input_ids {tuple(input_ids.shape)}, got {positions.shape}")


def _allowed_targets(targets: torch.Tensor, allowed: torch.Tensor, vocab: int) -> torch.Tensor:
    """Ids -> indices into ``allowed``; ids outside it map to 0 (their logprob is meaningless and never used)."""
    if allowed.dim() != 1 or allowed.numel() == 0:
        raise ValueError(f"allowed must be a non-empty 1-D tensor of token ids, got shape {tuple(allowed.shape)}")
    if int(allowed.min()) < 0 or int(allowed.max()) >= vocab:
        raise ValueError(f"allowed holds ids outside the vocabulary [0, {vocab}); check the restricted id list")
    lookup = torch.zeros(vocab, dtype=torch.long, device=targets.device)
    lookup[allowed] = torch.arange(allowed.numel(), device=targets.device)
    return lookup[targets]


def token_logprobs(
    hidden: torch.Tensor,
    project: Projection,
    input_ids: torch.Tensor,
    *,
    temperature: float = 1.0,
    allowed: torch.Tensor | None = None,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk_tokens: int | None = 1024,
    positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Float32 ``logp [B, T]`` of ``input_ids`` and optionally ``entropy [B, T]``, both 0 at ``t = 0``.

    ``hidden [B, T, H]``: the model's final hidden states (after its last norm), ``project``: its LM head.
    ``chunk_tokens``: rows projected at a time, recomputed in backward; None projects all rows at once (the naive
    form, for comparison). ``positions [B, T]`` (bool, optional): compute only where True (e.g. the action tokens;
    0 elsewhere), which also saves the projection of every other row. ``temperature``, ``allowed``,
    ``with_entropy``, ``entropy_grad``: as in :func:`chunk_logprobs`.
    Raises ValueError on mismatched shapes, ``temperature <= 0``, ``chunk_tokens < 1`` or ids outside the vocab.
    """
    _check(hidden, input_ids, temperature, chunk_tokens, positions)
    b, t, h = hidden.shape
    rows = hidden[:, :-1].reshape(-1, h)
    targets = input_ids[:, 1:].reshape(-1)
    sel: torch.Tensor | None = None
    if positions is not None:
        sel = positions[:, 1:].reshape(-1).bool().nonzero().squeeze(1)
        rows, targets = rows.index_select(0, sel), targets.index_select(0, sel)
    n = rows.shape[0]
    if allowed is not None and n:
        with torch.no_grad():  # the vocabulary size, from one projected row
            vocab = project(rows[:1]).shape[-1]
        allowed = allowed.to(device=targets.device, dtype=torch.long)
        targets = _allowed_targets(targets, allowed, vocab)

    def one(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return chunk_logprobs(project(x), y, temperature, allowed, with_entropy, entropy_grad)

    step = max(n, 1) if chunk_tokens is None else chunk_tokens
    lps: list[torch.Tensor] = []
    ents: list[torch.Tensor] = []
    for s in range(0, n, step):
        h_c, y_c = rows[s : s + step], targets[s : s + step]
        if chunk_tokens is None or not torch.is_grad_enabled():
            lp_c, ent_c = one(h_c, y_c)
        else:
            lp_c, ent_c = checkpoint(one, h_c, y_c, use_reentrant=False)
        lps.append(lp_c)
        if ent_c is not None:
            ents.append(ent_c)
    logp = _place(lps, b, t, sel, hidden.device)
    ent = _place(ents, b, t, sel, hidden.device) if with_entropy else None
    if n == 0 and hidden.requires_grad:
        # No row selected: zeros that still hang on the graph, so a loss built on them can call backward().
        zero = hidden.sum().float() * 0.0
        logp = logp + zero
        ent = None if ent is None else ent + zero
    return logp, ent


def _place(parts: list[torch.Tensor], b: int, t: int, sel: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """Per-row values back to ``[B, T]`` (0 at ``t = 0`` and at unselected positions), differentiably."""
    flat = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float32, device=device)
    if sel is not None:
        flat = torch.zeros(b * (t - 1), dtype=flat.dtype, device=device).index_copy(0, sel, flat)
    return F.pad(flat.view(b, t - 1), (1, 0))
