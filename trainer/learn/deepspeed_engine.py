"""DeepSpeed engines and the helpers of their forward / backward / step, shared by the learner, value pretraining
and SFT.

``make_engine`` / ``ds_config`` build an engine (torch AdamW on CPU, skipping non-finite steps: ``FiniteAdamW``),
``grad_accum_steps`` says how many micro batches make one optimizer step, ``mark_boundary`` closes the optimizer step
on the last of them, and ``plain_grads`` / ``full_grad_norm`` read the gradient norm where DeepSpeed reports none.
What the micro batches are (``sao.trainer.learn.batch.shard_batch``), how their losses are weighted (``token_scale``
beside it) and what a step computes (``sao.trainer.learn.learner``) live with the batch and the algorithm.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from sao.trainer import distributed as dist_utils
from sao.trainer.config import Config, ConfigError


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


def mark_boundary(engine: Any, i: int, n: int) -> None:
    """Before micro batch ``i`` of ``n``: tell DeepSpeed whether this one closes the optimizer step (gradient
    reduction, clipping, the update). With a token budget ``n`` changes from batch to batch, so the engine's own
    count (``gradient_accumulation_steps``, fixed when it was built) cannot say; its loss scaling by that count
    stays, and ``token_scale`` undoes it whatever ``n`` is."""
    engine.set_gradient_accumulation_boundary(i == n - 1)


def full_grad_norm(engine: Any) -> float:
    """L2 norm of the gradients held in ``p.grad`` (ZeRO 0, where DeepSpeed reports none itself)."""
    total = 0.0
    for p in engine.module.parameters():
        if p.grad is not None:
            total += float(p.grad.detach().float().pow(2).sum())
    return math.sqrt(total)


def plain_grads(engine: Any) -> bool:
    """Whether ``p.grad`` holds this rank's full gradient (ZeRO 0), so the norm can be read off the parameters."""
    return int(engine.zero_optimization_stage()) == 0
