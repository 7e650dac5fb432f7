"""DeepSpeed engines and the micro-batch plumbing shared by the learner, value pretraining and SFT.

``make_engine`` / ``ds_config`` build an engine (torch AdamW on CPU, skipping non-finite steps); ``grad_accum_steps``,
``shard_batch`` and ``token_scale`` cut a global batch into this rank's micro batches and weight their losses so that
accumulation over micro batches and ranks equals one token-mean over the whole batch; ``critic_step`` is one value
optimizer step over those micro batches; ``ev_parts`` / ``ev_from_parts`` the batch's explained variance.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from trainer import distributed as dist_utils
from trainer.algos.losses import value_loss
from trainer.batch import Batch
from trainer.config import Config, ConfigError
from trainer.models import shifted_values


def ds_config(cfg: Config, grad_accum: int, lr: float, weight_decay: float, warmup_steps: int = 0) -> dict[str, Any]:
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
        "gradient_clipping": d.gradient_clipping,
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
    model: nn.Module, cfg: Config, grad_accum: int, lr: float, weight_decay: float, warmup_steps: int = 0
) -> Any:
    """A DeepSpeed engine; on CPU without offload a torch AdamW, so no CUDA/JIT optimizer op is built."""
    import deepspeed

    conf = ds_config(cfg, grad_accum, lr, weight_decay, warmup_steps)
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


def shard_batch(full: Batch, micro_batch_size: int) -> list[Batch]:
    """This rank's rows of a global batch (rank, rank + world, ...), cut into micro batches on the device."""
    rank, world = dist_utils.rank(), dist_utils.world_size()
    mine = list(range(rank, full.shape[0], world))
    chunks = [mine[i : i + micro_batch_size] for i in range(0, len(mine), micro_batch_size)]
    dev = dist_utils.device()
    return [full.rows(c).to(dev) for c in chunks]


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
