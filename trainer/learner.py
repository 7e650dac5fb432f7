"""The learner: DeepSpeed actor + critic and one training step (values -> GAE -> policy step -> K critic steps)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from agent.records import Trajectory
from trainer import distributed as dist_utils
from trainer.algos.advantages import RunningMeanBaseline, whiten, whiten_stats
from trainer.algos.losses import value_loss
from trainer.algos.registry import AdvantageInputs, PolicyLossInputs, get_advantage, get_policy_loss
from trainer.batching import TrainBatch, collate
from trainer.config import Config, ConfigError
from trainer.models import shifted_values

# algorithm -> (advantage estimator, policy loss) in the core-math registries.
ALGO_TABLE = {
    "sao": ("skip_obs_gae", "dis"),
    "ppo": ("skip_obs_gae", "decoupled_ppo"),
    "grpo": ("grpo", "ppo_clip"),
    "grpo_dis": ("grpo", "dis"),
    "running_mean": ("running_mean", "dis"),
}


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


def make_engine(
    model: nn.Module, cfg: Config, grad_accum: int, lr: float, weight_decay: float, warmup_steps: int = 0
) -> Any:
    """A DeepSpeed engine; on CPU without offload a torch AdamW, so no CUDA/JIT optimizer op is built."""
    import deepspeed

    conf = ds_config(cfg, grad_accum, lr, weight_decay, warmup_steps)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ConfigError("no trainable parameters; check critic.freeze_attention and the model")
    opt = None if "optimizer" in conf else torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, optimizer=opt, config=conf)
    return engine


def _grad_norm(engine: Any) -> float:
    total = 0.0
    for p in engine.module.parameters():
        if p.grad is not None:
            total += float(p.grad.detach().float().pow(2).sum())
    return math.sqrt(total)


class Learner:
    """Owns the actor/critic engines of this rank and trains on a global batch, of which it computes its shard."""

    def __init__(self, cfg: Config, actor: nn.Module, critic: nn.Module | None, pad_token_id: int) -> None:
        self.cfg = cfg
        t = cfg.trainer
        world = dist_utils.world_size()
        if t.batch_size % world:
            raise ConfigError(
                f"trainer.batch_size ({t.batch_size}) must be a multiple of the number of ranks ({world})"
            )
        self.shard = t.batch_size // world
        self.grad_accum = math.ceil(self.shard / cfg.deepspeed.micro_batch_size)
        self.adv_name, self.loss_name = ALGO_TABLE[t.algorithm]
        self.adv_fn = get_advantage(self.adv_name)
        self.loss_fn = get_policy_loss(self.loss_name)
        self.actor = make_engine(actor, cfg, self.grad_accum, t.lr, t.weight_decay, t.warmup_steps)
        self.critic = (
            make_engine(critic, cfg, self.grad_accum, cfg.critic.lr, cfg.critic.weight_decay)
            if critic is not None
            else None
        )
        self.pad_token_id = pad_token_id
        self.allowed: torch.Tensor | None = None
        self.baseline = RunningMeanBaseline(decay=t.running_mean_momentum or None)
        self.device = dist_utils.device()

    # -- forward helpers -------------------------------------------------------------------------------------
    def _to(self, b: TrainBatch) -> TrainBatch:
        return TrainBatch(*(getattr(b, f).to(self.device) for f in TrainBatch.__dataclass_fields__))

    def _logp(self, b: TrainBatch, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = self.actor(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids)
        logits = out.logits[:, :-1].float()
        target = b.input_ids[:, 1:]
        if self.allowed is not None:
            # Sampling was restricted to these ids: the policy is the softmax over their logits alone (the same
            # distribution as masking the rest to -inf, without a full-vocabulary softmax). Targets outside the
            # set are prompt/observation tokens, whose logprob is never used.
            allowed = self.allowed.to(logits.device)
            logits = logits.index_select(-1, allowed)
            lookup = torch.zeros(out.logits.shape[-1], dtype=torch.long, device=logits.device)
            lookup[allowed] = torch.arange(allowed.numel(), device=logits.device)
            target = lookup[target]
        logp_all = torch.log_softmax(logits, -1)
        logp = torch.zeros(b.input_ids.shape, dtype=torch.float32, device=self.device)
        logp[:, 1:] = logp_all.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        ent = None
        if with_entropy:
            # With an entropy bonus the entropy must carry its gradient (a detached one made the bonus a no-op).
            lp = logp_all if self.cfg.trainer.entropy_coef else logp_all.detach()
            probs = lp.exp()
            ent = torch.zeros_like(logp)
            ent[:, 1:] = -(probs * torch.where(probs > 0, lp, 0.0)).sum(-1)
        return logp, ent

    def _values(self, b: TrainBatch) -> torch.Tensor:
        assert self.critic is not None
        return shifted_values(self.critic(b.input_ids, b.attention_mask, b.position_ids))

    def _micro(self, rows: list[int]) -> list[list[int]]:
        mb = self.cfg.deepspeed.micro_batch_size
        return [rows[i : i + mb] for i in range(0, len(rows), mb)]

    # -- the step --------------------------------------------------------------------------------------------
    def train_step(self, trajs: list[Trajectory]) -> dict[str, float]:
        """One policy version: critic values -> advantages -> one policy step -> K critic steps."""
        t = self.cfg.trainer
        full = collate(trajs, self.pad_token_id)
        rank, world = dist_utils.rank(), dist_utils.world_size()
        mine = list(range(rank, len(trajs), world))
        micro = [self._to(full.rows(r)) for r in self._micro(mine)]
        n_total = dist_utils.all_reduce_sum([float(sum(int(b.action_mask.sum()) for b in micro))])[0]
        n_total = max(n_total, 1.0)
        scale_base = self.grad_accum * world / n_total  # DeepSpeed averages over accumulation steps and ranks
        m: dict[str, float] = {}

        # 1) critic values (no grad) and 2) advantages.
        old_values: list[torch.Tensor] = []
        advs: list[torch.Tensor] = []
        rets: list[torch.Tensor] = []
        if self.critic is not None:
            with torch.no_grad():
                for b in micro:
                    v = self._values(b) * b.action_mask
                    old_values.append(v)
                    a, r = self._gae(b, v)
                    advs.append(a)
                    rets.append(r)
        else:
            group_ids = torch.tensor([_group_key(tr, i) for i, tr in enumerate(trajs)], dtype=torch.long)
            a_full, _ = self.adv_fn(
                AdvantageInputs(
                    rewards=full.rewards,
                    action_mask=full.action_mask,
                    group_ids=group_ids,
                    baseline=self.baseline,
                    gamma=t.gamma,
                    lam=t.lam,
                )
            )
            for rows in self._micro(mine):
                advs.append(a_full[rows].to(self.device))
            m["baseline_mean"] = float(self.baseline.mean)

        parts = [whiten_stats(a, b.action_mask) for a, b in zip(advs, micro, strict=True)]
        raw_stats = dist_utils.all_reduce_sum([sum(p[i] for p in parts) for i in range(3)])
        n_adv = max(raw_stats[0], 1.0)
        m["advantage_mean"] = raw_stats[1] / n_adv
        m["advantage_std"] = math.sqrt(max(raw_stats[2] / n_adv - m["advantage_mean"] ** 2, 0.0))
        if t.normalize_advantages:
            stats = (raw_stats[0], raw_stats[1], raw_stats[2])
            floor = t.advantage_std_floor
            advs = [whiten(a, b.action_mask, stats, floor) for a, b in zip(advs, micro, strict=True)]

        # Old-policy recompute for the PPO-style losses (one step per batch, so it equals the pre-step policy).
        olds: list[torch.Tensor | None] = [None] * len(micro)
        if self.loss_name in ("ppo_clip", "decoupled_ppo"):
            with torch.no_grad():
                olds = [self._logp(b, False)[0] for b in micro]

        # 3) one policy step.
        sums: dict[str, float] = {}
        gn_actor: float | None = None
        for b, adv, old in zip(micro, advs, olds, strict=True):
            logp, ent = self._logp(b, True)
            loss, lm = self.loss_fn(
                PolicyLossInputs(
                    logp=logp,
                    rollout_logp=b.rollout_logprobs,
                    advantages=adv,
                    action_mask=b.action_mask,
                    old_logp=old,
                    eps_low=t.eps_low,
                    eps_high=t.eps_high,
                    behavior_weight_cap=None,
                )
            )
            n_mb = float(b.action_mask.sum())
            mask = b.action_mask
            ent_mean = float((ent.detach() * mask).sum() / max(n_mb, 1.0)) if ent is not None else 0.0
            if t.entropy_coef and ent is not None:
                loss = loss - t.entropy_coef * (ent * mask).sum() / max(n_mb, 1.0)
            self.actor.backward(loss * n_mb * scale_base)
            if b is micro[-1] and self.cfg.deepspeed.zero_stage == 0:
                gn_actor = _grad_norm(self.actor)
            self.actor.step()  # DeepSpeed steps the optimizer only at the accumulation boundary
            vals: dict[str, float] = {k: float(x) for k, x in lm.items()}
            vals.update(entropy=ent_mean, pg_loss=float(loss.detach()))
            for k, val in vals.items():
                if k == "num_tokens" or not math.isfinite(val):
                    continue
                sums[k] = sums.get(k, 0.0) + val * n_mb
        gn = self.actor.get_global_grad_norm()
        m["actor_grad_norm"] = float(gn) if gn is not None else float(gn_actor or 0.0)
        keys = sorted(sums)
        red = dist_utils.all_reduce_sum([sums[k] for k in keys])
        for k, total in zip(keys, red, strict=True):
            m[k] = total / n_total

        # 4) K critic steps on the returns.
        if self.critic is not None:
            m.update(self._critic_steps(micro, old_values, rets, scale_base, n_total))
            ev_num = dist_utils.all_reduce_sum(_ev_parts(old_values, rets, micro))
            m["explained_variance"] = _ev_from_parts(ev_num)
        m["trained_tokens"] = n_total
        return m

    def _gae(self, b: TrainBatch, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = self.cfg.trainer
        if not t.length_adaptive_lambda:
            res: tuple[torch.Tensor, torch.Tensor] = self.adv_fn(
                AdvantageInputs(rewards=b.rewards, action_mask=b.action_mask, values=values, gamma=t.gamma, lam=t.lam)
            )
            return res
        # VAPO: the policy's lambda adapts to each sequence's length; the critic learns from lambda = 1 returns.
        _, ret = self.adv_fn(
            AdvantageInputs(rewards=b.rewards, action_mask=b.action_mask, values=values, gamma=t.gamma, lam=1.0)
        )
        adv = torch.zeros_like(ret)
        for i in range(b.input_ids.shape[0]):
            n = max(int(b.action_mask[i].sum()), 1)
            lam_i = min(max(1.0 - 1.0 / (t.lambda_alpha * n), 0.0), 1.0)
            a_i, _ = self.adv_fn(
                AdvantageInputs(
                    rewards=b.rewards[i : i + 1],
                    action_mask=b.action_mask[i : i + 1],
                    values=values[i : i + 1],
                    gamma=t.gamma,
                    lam=lam_i,
                )
            )
            adv[i] = a_i[0]
        return adv, ret

    def _critic_steps(
        self,
        micro: list[TrainBatch],
        old_values: list[torch.Tensor],
        rets: list[torch.Tensor],
        scale_base: float,
        n_total: float,
    ) -> dict[str, float]:
        assert self.critic is not None
        losses: list[float] = []
        norms: list[float] = []
        for _ in range(self.cfg.trainer.critic_updates_per_step):
            total = 0.0
            gn0: float | None = None
            for b, old, ret in zip(micro, old_values, rets, strict=True):
                values = self._values(b)
                loss, _ = value_loss(values, old, ret, b.action_mask, self.cfg.critic.value_clip)
                n_mb = float(b.action_mask.sum())
                self.critic.backward(loss * n_mb * scale_base)
                total += float(loss.detach()) * n_mb
                if b is micro[-1] and self.cfg.deepspeed.zero_stage == 0:
                    gn0 = _grad_norm(self.critic)
                self.critic.step()
            gn = self.critic.get_global_grad_norm()
            norms.append(float(gn) if gn is not None else float(gn0 or 0.0))
            losses.append(total)
        red = dist_utils.all_reduce_sum(losses)
        return {
            "value_loss": red[-1] / max(n_total, 1.0),
            "value_loss_first": red[0] / max(n_total, 1.0),
            "critic_grad_norm": norms[-1],
        }

    # -- state -----------------------------------------------------------------------------------------------
    def save(self, ckpt_dir: Path) -> None:
        """Collective: every rank writes its ZeRO partition of model + optimizer."""
        self.actor.save_checkpoint(str(ckpt_dir), tag="actor")
        if self.critic is not None:
            self.critic.save_checkpoint(str(ckpt_dir), tag="critic")

    def load(self, ckpt_dir: Path) -> None:
        self.actor.load_checkpoint(str(ckpt_dir), tag="actor")
        if self.critic is not None:
            self.critic.load_checkpoint(str(ckpt_dir), tag="critic")

    def gathered_state(self, engine: Any) -> dict[str, torch.Tensor] | None:
        """Collective: the full state dict on rank 0 (ZeRO-3 parameters gathered), None elsewhere."""
        import deepspeed

        module = engine.module
        if self.cfg.deepspeed.zero_stage == 3:
            with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
                sd = (
                    {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
                    if dist_utils.rank() == 0
                    else None
                )
            return sd
        return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()} if dist_utils.rank() == 0 else None


def _group_key(tr: Trajectory, i: int) -> int:
    g = tr.info.get("sao_group")
    return int(g) if g is not None else i


def _ev_parts(values: list[torch.Tensor], rets: list[torch.Tensor], micro: list[TrainBatch]) -> list[float]:
    n = s_r = s_r2 = s_e = s_e2 = 0.0
    for v, r, b in zip(values, rets, micro, strict=True):
        mk = b.action_mask
        rr, ee = r[mk].double(), (r - v)[mk].double()
        n += rr.numel()
        s_r += float(rr.sum())
        s_r2 += float((rr**2).sum())
        s_e += float(ee.sum())
        s_e2 += float((ee**2).sum())
    return [n, s_r, s_r2, s_e, s_e2]


def _ev_from_parts(p: list[float]) -> float:
    n, s_r, s_r2, s_e, s_e2 = p
    if n < 2:
        return float("nan")
    var_r = s_r2 / n - (s_r / n) ** 2
    var_e = s_e2 / n - (s_e / n) ** 2
    return 1.0 - var_e / var_r if var_r > 1e-12 else float("nan")
