"""DeepSpeed engines and the micro-batch plumbing shared by the learner, value pretraining and SFT.

``make_engine`` / ``ds_config`` build an engine (torch AdamW on CPU, skipping non-finite steps); ``shard_batch``
(planned by ``micro_rows``: a token budget, or the plain row cut) cuts a global batch into this rank's micro batches,
``mark_boundary`` closes the optimizer step on the last of them, and ``token_scale`` weights their losses so that
accumulation over micro batches and ranks equals one token-mean over the whole batch, however it was cut;
``critic_step`` is one value optimizer step over those micro batches; ``ev_parts`` / ``ev_from_parts`` the batch's
explained variance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from sao.trainer import distributed as dist_utils
from sao.trainer.algos.losses import value_loss
from sao.trainer.config import Config, ConfigError, DeepSpeedConfig
from sao.trainer.learn.batch import Batch
from sao.trainer.learn.models import shifted_values


def ds_config(
    cfg: Config, grad_accum: int, lr: float, weight_decay: float, warmup_steps: int = 0, clip: float | None = None
) -> dict[str, Any]:
    """``clip``: this engine's gradient-norm clip; None = ``deepspeed.gradient_clipping``."""
    d = cfg.deepspeed
    zero: dict[str, Any] = {"stage": d.zero_stage}
    if d.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if d.offload_param and d.zero_stage == 3:
        zero["offload_param"] = {"device": "cpu"}
    out: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": d.micro_batch_size,
        "gradient_accumulation_steps": grad_accum,
        "train_batch_size": d.micro_batch_size * grad_accum * dist_utils.world_size(),
        "gradient_clipping": d.gradient_clipping if clip is None else clip,
        "bf16": {"enabled": d.bf16},
        "zero_optimization": zero,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if d.offload_optimizer or torch.cuda.is_available():
        # DeepSpeed's own (fused / CPU) Adam: needed for offload, fastest on GPU.
        out["optimizer"] = {"type": "AdamW", "params": {"lr": lr, "weight_decay": weight_decay}}
    if warmup_steps > 0:
        # Adam's first steps move every parameter by ~lr whatever the gradient's size: on a noisy batch that is a
        # random jump (e.g. a policy made near-deterministic in 3 steps); a linear warmup damps them.
        out["scheduler"] = {
            "type": "WarmupLR",
            "params": {
                "warmup_min_lr": lr / (warmup_steps + 1),
                "warmup_max_lr": lr,
                "warmup_num_steps": warmup_steps,
                "warmup_type": "linear",
            },
        }
    return out


class FiniteAdamW(torch.optim.AdamW):
    """AdamW that skips a step whose gradients hold NaN/inf (no update, moments untouched) and says so through
    ``overflow``, the attribute DeepSpeed reads to count ``engine.skipped_steps``. DeepSpeed's ZeRO 1-3 and bf16
    optimizers do this check themselves; this covers ZeRO 0 in fp32, where the engine steps a torch optimizer."""

    overflow = False

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        self.overflow = bool(grads) and not bool(torch.stack([torch.isfinite(x).all() for x in grads]).all())
        if self.overflow:
            self.zero_grad(set_to_none=True)
            return None
        return super().step(closure)


def make_engine(
    model: nn.Module,
    cfg: Config,
    grad_accum: int,
    lr: float,
    weight_decay: float,
    warmup_steps: int = 0,
    clip: float | None = None,
) -> Any:
    """A DeepSpeed engine; on CPU without offload a torch AdamW, so no CUDA/JIT optimizer op is built."""
    import deepspeed

    conf = ds_config(cfg, grad_accum, lr, weight_decay, warmup_steps, clip)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ConfigError("no trainable parameters; check critic.freeze_attention and the model")
    opt: torch.optim.Optimizer | None = None
    if "optimizer" not in conf:
        # ZeRO >= 1 and bf16 wrap the optimizer in DeepSpeed's own, which checks gradients itself and accepts
        # only the torch class by exact type.
        plain = cfg.deepspeed.zero_stage == 0 and not cfg.deepspeed.bf16
        opt = (FiniteAdamW if plain else torch.optim.AdamW)(params, lr=lr, weight_decay=weight_decay)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, optimizer=opt, config=conf)
    return engine


def grad_accum_steps(batch_size: int, micro_batch_size: int) -> int:
    """Micro batches per optimizer step on each rank for a global batch of ``batch_size`` rows."""
    world = dist_utils.world_size()
    if batch_size % world:
        raise ConfigError(f"trainer.batch_size ({batch_size}) must be a multiple of the number of ranks ({world})")
    return math.ceil(batch_size // world / micro_batch_size)


def micro_rows(
    lengths: Sequence[int], world: int, micro_batch_size: int, micro_batch_tokens: int
) -> list[list[list[int]]]:
    """Every rank's micro batches as rows of the global batch (``[rank][micro] -> rows``), from the row lengths
    alone, so every rank computes the same plan without talking to the others.

    ``micro_batch_tokens == 0``, the row cut: rank r takes rows r, r + world, ... in chunks of ``micro_batch_size``.
    Otherwise the token budget: rows go to the ranks longest first, each to the rank holding the fewest tokens so
    far; on each rank, longest first, a micro batch takes rows while ``rows x its longest row`` stays within
    ``micro_batch_tokens`` and ``rows`` within ``micro_batch_size``. Either way a rank with fewer micro batches than
    another gets empty ones (``[]``) at the end: the accumulation boundary, where the ranks reduce gradients, must
    fall on the same micro batch on every rank.
    """
    if world < 1 or micro_batch_size < 1 or micro_batch_tokens < 0:
        raise ValueError("world and micro_batch_size must be >= 1, micro_batch_tokens >= 0")
    if micro_batch_tokens == 0:
        mine = [list(range(r, len(lengths), world)) for r in range(world)]
        plans = [[m[i : i + micro_batch_size] for i in range(0, len(m), micro_batch_size)] for m in mine]
    else:
        per_rank: list[list[int]] = [[] for _ in range(world)]
        load = [0] * world
        for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
            r = min(range(world), key=lambda k: (load[k], len(per_rank[k]), k))
            per_rank[r].append(i)
            load[r] += lengths[i]
        plans = [_pack(rows, lengths, micro_batch_size, micro_batch_tokens) for rows in per_rank]
    n = max(len(p) for p in plans)
    return [p + [[] for _ in range(n - len(p))] for p in plans]


def _pack(rows: list[int], lengths: Sequence[int], max_rows: int, budget: int) -> list[list[int]]:
    """Rows sorted longest first into micro batches: each is padded to its first row, so it fits while
    ``(rows + 1) x lengths[first] <= budget``."""
    out: list[list[int]] = []
    for i in rows:
        if out and len(out[-1]) < max_rows and (len(out[-1]) + 1) * lengths[out[-1][0]] <= budget:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _cuts(full: Batch, d: DeepSpeedConfig) -> list[tuple[list[int], int]]:
    """This rank's micro batches as ``(rows, width)``: the row cut keeps the batch's width, the token budget pads
    each micro batch to its own longest row; an empty one is one token wide."""
    lengths = full.lengths
    plan = micro_rows(lengths, dist_utils.world_size(), d.micro_batch_size, d.micro_batch_tokens)
    mine = plan[dist_utils.rank()]
    if d.micro_batch_tokens == 0:
        return [(rows, full.shape[1] if rows else 1) for rows in mine]
    return [(rows, max((lengths[i] for i in rows), default=1)) for rows in mine]


def shard_batch(full: Batch, d: DeepSpeedConfig) -> list[Batch]:
    """This rank's micro batches of a global batch (``micro_rows`` with ``deepspeed.micro_batch_size`` /
    ``micro_batch_tokens``), on the device. An empty micro batch is one attended token of row 0 with nothing to
    train (no action or response token, no reward): it runs forward and backward like the others, so collective
    ops inside them (ZeRO-3 gathers, gradient reduction) match across ranks, and adds exactly zero gradient."""
    dev = dist_utils.device()
    out = []
    for rows, width in _cuts(full, d):
        if rows:
            out.append(full.rows(rows).columns(width).to(dev))
            continue
        one = full.rows([0]).columns(1)
        off = torch.zeros_like(one.action_mask)
        idle = replace(one, action_mask=off, response_mask=off, rewards=torch.zeros_like(one.rewards),
                       rollout_logprobs=torch.zeros_like(one.rollout_logprobs))  # fmt: skip
        out.append(idle.to(dev))
    return out


def shard_like(t: torch.Tensor, full: Batch, d: DeepSpeedConfig) -> list[torch.Tensor]:
    """A ``[B, T]`` tensor of the global batch (e.g. advantages computed over all of it) cut exactly as
    ``shard_batch`` cuts ``full``, on the device; zeros on an empty micro batch."""
    dev = dist_utils.device()
    return [(t[rows, :width] if rows else t.new_zeros((1, 1))).to(dev) for rows, width in _cuts(full, d)]


def mark_boundary(engine: Any, i: int, n: int) -> None:
    """Before micro batch ``i`` of ``n``: tell DeepSpeed whether this one closes the optimizer step (gradient
    reduction, clipping, the update). With a token budget ``n`` changes from batch to batch, so the engine's own
    count (``gradient_accumulation_steps``, fixed when it was built) cannot say; its loss scaling by that count
    stays, and ``token_scale`` undoes it whatever ``n`` is."""
    engine.set_gradient_accumulation_boundary(i == n - 1)


def token_scale(masks: list[torch.Tensor], grad_accum: int) -> tuple[float, float]:
    """``(n_total, scale)``: the masked tokens over all ranks (0 when there is nothing to train), and the factor
    that turns a micro batch's token-mean loss times its token count into its share of one global token-mean
    (DeepSpeed averages over accumulation steps and ranks, which the factor undoes)."""
    n_total = dist_utils.all_reduce_sum([float(sum(float(m.sum()) for m in masks))])[0]
    return n_total, grad_accum * dist_utils.world_size() / max(n_total, 1.0)


def full_grad_norm(engine: Any) -> float:
    """L2 norm of the gradients held in ``p.grad`` (ZeRO 0, where DeepSpeed reports none itself)."""
    total = 0.0
    for p in engine.module.parameters():
        if p.grad is not None:
            total += float(p.grad.detach().float().pow(2).sum())
    return math.sqrt(total)


def critic_step(
    engine: Any,
    micro: list[Batch],
    masks: list[torch.Tensor],
    returns: list[torch.Tensor],
    old_values: list[torch.Tensor] | None,
    clip: float | None,
    scale: float,
    seen: list[torch.Tensor] | None = None,
) -> tuple[float, float, bool]:
    """One critic optimizer step over the micro batches (value loss on ``masks``); returns ``(sum of token losses,
    grad norm, skipped)``. ``old_values`` (the values before the K steps) anchor the value clip; None: no clip.
    ``seen`` collects the (pre-step) values of each micro batch."""
    total = 0.0
    gn0: float | None = None
    skipped0 = int(getattr(engine, "skipped_steps", 0))
    for i, (b, mask, ret) in enumerate(zip(micro, masks, returns, strict=True)):
        mark_boundary(engine, i, len(micro))
        values = shifted_values(engine(b.input_ids, b.attention_mask, b.position_ids))
        ok = mask & torch.isfinite(values.detach())
        if seen is not None:
            seen.append(values.detach())
        old = old_values[i] if old_values is not None else values.detach()
        loss, _ = value_loss(values, torch.where(ok, old, 0.0), ret, ok, clip if old_values is not None else None)
        n_mb = float(ok.sum())
        engine.backward(loss * n_mb * scale)
        total += float(loss.detach()) * n_mb
        if i == len(micro) - 1 and plain_grads(engine):
            gn0 = full_grad_norm(engine)
        engine.step()  # DeepSpeed steps the optimizer only at the accumulation boundary
    gn = engine.get_global_grad_norm()
    norm = float(gn) if gn is not None else float(gn0 or 0.0)
    return total, norm, int(getattr(engine, "skipped_steps", 0)) > skipped0


def plain_grads(engine: Any) -> bool:
    """Whether ``p.grad`` holds this rank's full gradient (ZeRO 0), so the norm can be read off the parameters."""
    return int(engine.zero_optimization_stage()) == 0


def ev_parts(values: list[torch.Tensor], rets: list[torch.Tensor], masks: list[torch.Tensor]) -> list[float]:
    """Sums over micro batches (all-reduce them across ranks) from which ``ev_from_parts`` gives the explained
    variance ``1 - Var(R - V) / Var(R)`` of the whole batch."""
    n = s_r = s_r2 = s_e = s_e2 = 0.0
    for v, r, mk in zip(values, rets, masks, strict=True):
        rr, ee = r[mk].double(), (r - v)[mk].double()
        n += rr.numel()
        s_r += float(rr.sum())
        s_r2 += float((rr**2).sum())
        s_e += float(ee.sum())
        s_e2 += float((ee**2).sum())
    return [n, s_r, s_r2, s_e, s_e2]


def ev_from_parts(p: list[float]) -> float:
    n, s_r, s_r2, s_e, s_e2 = p
    if n < 2:
        return float("nan")
    var_r = s_r2 / n - (s_r / n) ** 2
    var_e = s_e2 / n - (s_e / n) ** 2
    return 1.0 - var_e / var_r if var_r > 1e-12 else float("nan")
