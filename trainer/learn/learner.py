"""The learner: DeepSpeed actor + critic and one training step, read top to bottom in ``Learner.train_step``:
the batch (this rank's micro batches) -> values (the critic's) -> advantages (and the critic's returns) -> policy
step(s) -> K critic steps (``critic_step``, shared with value pretraining). Where a critic trains, the values come
from the first critic step's own forward (``_values_with_critic_step``): one critic forward fewer a step, the same
numbers (measured bit-identical weights after two steps, ZeRO 0 and 2, both update orders).

What the step does is read from the algorithm's spec (``cfg.algorithm``): which advantage estimator and policy loss,
whether a critic trains, whether an old-policy recompute precedes the policy step. The micro batches and their loss
weights come from ``sao.trainer.learn.batch``, the engines and their backward / step helpers from
``sao.trainer.learn.deepspeed_engine`` (shared with value pretraining and SFT).

Bad numbers never crash a step: a trajectory with a non-finite reward is masked out, a token with a non-finite
rollout (or recomputed) logprob is masked out of the policy loss, a batch with non-finite critic values is not
trained on, and a non-finite gradient makes the optimizer skip that step (no update, not even Adam's moments).
Each is counted in the step's metrics (``nonfinite_*``, ``masked_nonfinite_tokens``, ``skipped_steps``).
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sao.agent.records import Trajectory
from sao.trainer import distributed as dist_utils
from sao.trainer.algos.advantages import (
    RunningMeanBaseline,
    advantages_per_row_lambda,
    row_lambdas,
    turn_sign_stats,
    whiten,
    whiten_stats,
)
from sao.trainer.algos.logprobs import token_logprobs
from sao.trainer.algos.losses import explained_variance_from_sums, explained_variance_sums, value_loss
from sao.trainer.algos.registry import (
    AdvantageInputs,
    PolicyLossInputs,
    advantage_traits,
    get_advantage,
    get_policy_loss,
    policy_loss_traits,
)
from sao.trainer.config import Config, ConfigError
from sao.trainer.learn.batch import Batch, collate, micro_batch_rows, shard_batch, shard_like, token_scale
from sao.trainer.learn.deepspeed_engine import full_grad_norm, grad_accum_steps, make_engine, mark_boundary, plain_grads
from sao.trainer.learn.models import shifted_values
from sao.trainer.learn.targets import (
    critic_returns,
    gae_inputs,
    value_after,
    value_mask,
    value_targets,
    values_as_read,
)
from sao.trainer.learn.token_records import RowTokens, TokenProbe

# Rows of the LM head computed at a time for logprobs: 1,024 x V float32 is 200 MB at SmolLM2's 49k vocabulary,
# 620 MB at a 152k one (docs/scale.md).
LOGPROB_CHUNK_TOKENS = 1024

# -- the step ---------------------------------------------------------------------------------------------------


@dataclass
class _Values:
    """Per micro batch: the critic's values ``[B, T]`` (0 off the response tokens) and the value after each row's
    last token ``[B]`` (``value_after``); both empty for an estimator that reads no values."""

    values: list[torch.Tensor]
    after: list[torch.Tensor]


@dataclass
class _Advantages:
    """Per micro batch: actor advantages, critic returns and the values they came from (critic algorithms)."""

    advantages: list[torch.Tensor]
    returns: list[torch.Tensor]
    old_values: list[torch.Tensor]
    value_masks: list[torch.Tensor]


class Learner:
    """Owns the actor/critic engines of this rank and trains on a global batch, of which it computes its shard."""

    def __init__(
        self,
        cfg: Config,
        actor: nn.Module,
        critic: nn.Module | None,
        pad_token_id: int,
        allowed: torch.Tensor | None = None,
    ) -> None:
        """``allowed``: the token ids sampling was restricted to (``rollout.action_vocab``), for the recompute."""
        self.cfg = cfg
        t = cfg.trainer
        self.spec = cfg.algorithm
        if self.spec.critic and critic is None:
            raise ConfigError(f"trainer.algorithm {self.spec.name!r} trains a critic: pass one to the Learner")
        self.grad_accum = grad_accum_steps(t.batch_size, cfg.deepspeed.micro_batch_size)
        self.adv_fn = get_advantage(cfg.advantage_estimator)
        self.adv_traits = advantage_traits(cfg.advantage_estimator)
        self._value_positions = "token" if self.adv_traits.token_level else cfg.critic.value_positions
        self.loss_fn = get_policy_loss(self.spec.policy_loss)
        self.loss_traits = policy_loss_traits(self.spec.policy_loss)
        # the DIS band (trainer.dis_band) for losses that mask by it, else the PPO trust region
        self.ratio_bounds = cfg.dis_bounds if self.loss_traits.dis_band else (t.eps_low, t.eps_high)
        self.temperature = cfg.rollout.temperature
        self.actor = make_engine(actor, cfg, self.grad_accum, t.lr, t.weight_decay, t.warmup_steps)
        c = cfg.critic
        self.critic = (
            make_engine(critic, cfg, self.grad_accum, c.lr, c.weight_decay, clip=c.gradient_clipping)
            if critic is not None and self.spec.critic
            else None
        )
        self.pad_token_id = pad_token_id
        self.allowed = allowed
        self.baseline = RunningMeanBaseline(decay=t.running_mean_momentum or None)
        # trainer.token_records: rank 0 records a sample of its rows; the run reads them after each step
        self.token_rows: list[RowTokens] = []
        self._token_sample = t.token_records if dist_utils.rank() == 0 else 0
        self._token_rng = random.Random(cfg.run.seed)
        # a head-only critic (critic.train_backbone: false): the frozen backbone's features of each micro batch,
        # read once per step and reused by the K critic steps (the same numbers: nothing under them trains)
        self._head_only = self.critic is not None and not c.train_backbone
        self._features: list[torch.Tensor | None] = []
        # trainer.baseline_key: the key of each row's running mean (set per batch by train_step; None: one mean)
        self._row_keys: tuple[str, ...] | None = None

    # -- forward helpers -------------------------------------------------------------------------------------
    def _logp(self, b: Batch, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Current-policy logprob ``[B, T]`` of the action tokens (0 elsewhere, where nothing reads it) under the
        SAMPLED distribution (logits / rollout temperature, restricted to ``allowed`` ids when sampling was), and
        optionally its entropy."""
        # Hidden states, not logits: the LM head runs a chunk of rows at a time inside token_logprobs (recomputed in
        # backward), so no [B, T, V] float32 tensor exists; only the action tokens' rows are projected.
        out = self.actor(
            input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids,
            output_hidden_states=True, logits_to_keep=1,
        )  # fmt: skip
        return token_logprobs(
            out.hidden_states[-1], self.actor.module.get_output_embeddings(), b.input_ids,
            temperature=self.temperature, allowed=self.allowed, with_entropy=with_entropy,
            entropy_grad=self.cfg.trainer.entropy_coef > 0, chunk_tokens=LOGPROB_CHUNK_TOKENS, positions=b.action_mask,
        )  # fmt: skip

    def _critic_out(self, b: Batch, slot: int | None = None) -> torch.Tensor:
        """The critic's output on micro batch ``b``; a head-only critic keeps the features of micro batch ``slot``
        (``_features``) and reads them again instead of running its frozen backbone."""
        assert self.critic is not None
        if not self._head_only or slot is None:
            out: torch.Tensor = self.critic(b.input_ids, b.attention_mask, b.position_ids)
            return out
        raw: torch.Tensor
        raw, self._features[slot] = self.critic(
            b.input_ids, b.attention_mask, b.position_ids, features=self._features[slot], return_features=True
        )
        return raw

    def _values(self, b: Batch, slot: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(the critic's output ``[B, T]``, with its graph where grad is on; the shifted values on the response
        tokens, 0 elsewhere, detached; ``value_after`` ``[B]``). ``slot``: the micro batch's index (``_critic_out``)."""
        raw = self._critic_out(b, slot)
        rng = self.cfg.critic.value_range
        v = torch.where(b.response_mask, shifted_values(raw.detach()), 0.0)
        v = values_as_read(v, b, self._value_positions, rng)
        return raw, v, value_after(raw, b, rng)

    def _value_masks(self, micro: list[Batch]) -> list[torch.Tensor]:
        """The tokens whose values the critic loss trains, per micro batch."""
        positions = self.cfg.critic.value_positions
        return [b.response_mask if self.adv_traits.token_level else value_mask(b, positions) for b in micro]

    # -- the step --------------------------------------------------------------------------------------------
    def train_step(
        self, trajs: list[Trajectory], policy: bool = True, episodes: list[int] | None = None
    ) -> dict[str, float]:
        """One policy version: the batch -> values -> advantages -> ``ppo_epochs`` policy steps -> K critic steps.
        ``policy=False``: a critic warm-up batch (``trainer.critic_warmup_steps``): the K critic steps only.
        ``episodes``: the episode of each row (``Train.episodes``; None: a row each)."""
        full, bad = self._collate(trajs, episodes)
        self._row_keys = baseline_keys(trajs, self.cfg.trainer.baseline_key) if self.adv_traits.needs_baseline else None
        m: dict[str, float] = {
            "nonfinite_rewards": float(len(bad)),
            "uniform_reward_batch": float(_uniform_rewards(full, bad)),
        }
        micro = shard_batch(full, self.cfg.deepspeed)
        rows = micro_batch_rows(full, self.cfg.deepspeed)
        probe = TokenProbe.sample(rows, self._token_sample, self._token_rng)
        self.token_rows = []
        self._features = [None] * len(micro)
        fused = self._values_with_critic_step(full, micro, bad, m)
        if fused is not None:
            adv, first = fused
        else:  # no critic step to share the values' forward with
            adv, first = self._advantages(full, micro, bad, self._critic_values(micro, m), m), None
        critic_first = self.critic is not None and self.cfg.trainer.update_order == "critic_first"
        if adv is not None and critic_first:
            # the order the paper's ports use: K critic steps on the returns, then the policy's advantages from the
            # updated critic (ours, advantages_first, takes both from the values before the critic steps)
            m.update(self._critic_steps(micro, adv, first))
            values = self._critic_values(micro, m)
            adv = self._advantages(full, micro, bad, values, m)
        if adv is None:  # non-finite critic values: nothing of this batch can be trusted
            m.update(skipped_steps=float(self.cfg.policy_epochs), trained_tokens=0.0)
            m["critic_skipped_steps"] = float(self.cfg.trainer.critic_updates_per_step)
            return m
        if not policy:
            m.update(skipped_steps=0.0, critic_warmup=1.0, trained_tokens=0.0)
        elif self.cfg.trainer.skip_uniform_reward_batches and _uniform_rewards(full, bad):
            m.update(skipped_steps=float(self.cfg.policy_epochs), skipped_uniform_batches=1.0, trained_tokens=0.0)
        else:
            m.update(self._policy_steps(micro, adv.advantages, probe))
        if probe is not None:
            self.token_rows = probe.rows(micro, adv.advantages, adv.old_values, self.ratio_bounds)
        if self.critic is not None and not critic_first:
            m.update(self._critic_steps(micro, adv, first))
        return m

    def _collate(self, trajs: list[Trajectory], episodes: list[int] | None = None) -> tuple[Batch, list[int]]:
        """The global batch and the rows of trajectories with a non-finite reward: those keep their row (so every
        rank cuts the same micro batches) with no trainable token."""
        bad = [i for i, tr in enumerate(trajs) if not _finite_reward(tr)]
        clean = [_zero_reward(tr) if i in bad else tr for i, tr in enumerate(trajs)]
        full = collate(clean, self.pad_token_id, episodes=episodes)
        if bad:
            rows = torch.zeros(full.shape[0], 1, dtype=torch.bool)
            rows[bad] = True
            full = dataclasses.replace(
                full, action_mask=full.action_mask & ~rows, response_mask=full.response_mask & ~rows
            )
        return full, bad

    def _critic_values(self, micro: list[Batch], m: dict[str, float]) -> _Values | None:
        """The values phase: the critic's values of every micro batch (none for an estimator that reads none).
        None: a value is not finite somewhere, on some rank (counted in ``nonfinite_values``; the step is skipped)."""
        if not self.adv_traits.needs_values:
            return _Values([], [])
        with torch.no_grad():
            outs = [self._values(b, i) for i, b in enumerate(micro)]
        values, afters = [v for _, v, _ in outs], [a for _, _, a in outs]
        bad = sum(
            float((b.response_mask & ~torch.isfinite(v)).sum()) + float((~torch.isfinite(a)).sum())
            for b, v, a in zip(micro, values, afters, strict=True)
        )
        m["nonfinite_values"] = dist_utils.all_reduce_sum([bad])[0]
        return None if m["nonfinite_values"] > 0 else _Values(values, afters)

    def _values_with_critic_step(
        self, full: Batch, micro: list[Batch], bad_rows: list[int], m: dict[str, float]
    ) -> tuple[_Advantages | None, tuple[float, float, bool]] | None:
        """The values phase and the first of the K critic steps on one forward per micro batch: the critic's output
        with its graph gives the values (detached: the advantages, the returns and the clip's anchor, as the no-grad
        values phase gives them), then the first step's value loss on it, so that step does not run the forward
        again. The same numbers as ``_critic_values``, ``_advantages`` and a ``critic_step`` (the policy step that
        comes between them in ``advantages_first`` order never touches the critic). Returns (the advantages, the
        first step's ``critic_step`` result), or None where no critic step shares the forward (no critic, or no
        token for it). A non-finite value on any rank, known before the last micro batch's backward, makes that
        backward non-finite, so the optimizer skips the step as it skips any non-finite gradient; the advantages are
        then None (``nonfinite_values``: the whole step is skipped)."""
        if self.critic is None or not self.adv_traits.needs_values:
            return None
        masks = self._value_masks(micro)
        n_total, scale = token_scale(masks, self.grad_accum)
        if n_total == 0:
            return None
        eng, n = self.critic, len(micro)
        values: list[torch.Tensor] = []
        afters: list[torch.Tensor] = []
        gae: list[tuple[torch.Tensor, torch.Tensor]] = []
        bad, total, gn0 = 0.0, 0.0, None
        skipped0 = int(getattr(eng, "skipped_steps", 0))
        for i, (b, mask) in enumerate(zip(micro, masks, strict=True)):
            mark_boundary(eng, i, n)
            raw, v, after = self._values(b, i)
            bad += float((b.response_mask & ~torch.isfinite(v)).sum()) + float((~torch.isfinite(after)).sum())
            values.append(v)
            afters.append(after)
            gae.append(self._gae(b, v, after))
            if i == n - 1:
                m["nonfinite_values"] = dist_utils.all_reduce_sum([bad])[0]
            poison = i == n - 1 and m["nonfinite_values"] > 0
            clip = self.cfg.critic.value_clip
            total += _critic_backward(eng, shifted_values(raw), mask, v, gae[-1][1], clip, scale, poison)
            if i == n - 1 and plain_grads(eng):
                gn0 = full_grad_norm(eng)
            eng.step()  # DeepSpeed steps the optimizer only at the accumulation boundary
        first = (total, *_step_outcome(eng, gn0, skipped0))
        if m["nonfinite_values"] > 0:
            return None, first
        return self._advantages(full, micro, bad_rows, _Values(values, afters), m, gae=gae), first

    def _advantages(
        self,
        full: Batch,
        micro: list[Batch],
        bad_rows: list[int],
        values: _Values | None,
        m: dict[str, float],
        gae: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> _Advantages | None:
        """The advantages phase: GAE on the critic's ``values`` (and the critic's returns), or the algorithm's
        outcome estimator on the rewards; whitened if asked. None when ``values`` is (not finite: the step is
        skipped). ``bad_rows`` (no trainable reward) stay out of the group and running-mean baselines. ``gae``: the
        ``_gae`` of each micro batch, where it was already computed."""
        if values is None:
            return None
        value_masks = self._value_masks(micro)
        rets: list[torch.Tensor] = []
        if self.adv_traits.needs_values:
            pairs = gae or [self._gae(b, v, a) for b, v, a in zip(micro, values.values, values.after, strict=True)]
            advs, rets = [a for a, _ in pairs], [r for _, r in pairs]
        else:
            advs = self._outcome_advantages(full, bad_rows, m)
        return _Advantages(self._normalize(advs, micro, m), rets, values.values, value_masks)

    def _outcome_advantages(self, full: Batch, bad_rows: list[int], m: dict[str, float]) -> list[torch.Tensor]:
        """Advantages without a critic (group-normalised, running-mean baseline): computed over the whole batch,
        then cut like its micro batches."""
        t = self.cfg.trainer
        keep = [i for i in range(full.shape[0]) if i not in set(bad_rows)]
        a_full = torch.zeros(full.shape, dtype=torch.float32)
        if keep:
            sub = full.rows(keep)
            a_sub, _ = self.adv_fn(
                AdvantageInputs(
                    rewards=sub.rewards,
                    action_mask=sub.action_mask,
                    response_mask=sub.response_mask,
                    group_ids=sub.group_ids if self.adv_traits.needs_groups else None,
                    episode_ids=sub.episode_ids,
                    baseline=self.baseline if self.adv_traits.needs_baseline else None,
                    baseline_keys=None if self._row_keys is None else tuple(self._row_keys[i] for i in keep),
                    gamma=t.gamma,
                    lam=t.lam,
                )
            )
            a_full[keep] = a_sub.float()
        advs = shard_like(a_full, full, self.cfg.deepspeed)
        m["baseline_mean"] = float(self.baseline.mean)
        return advs

    def _normalize(self, advs: list[torch.Tensor], micro: list[Batch], m: dict[str, float]) -> list[torch.Tensor]:
        """The advantages whitened over the whole batch (all ranks) when ``trainer.normalize_advantages``; their
        mean and std, and the signs per turn against each episode's outcome, into ``m``."""
        t = self.cfg.trainer
        parts = [whiten_stats(a, b.action_mask) for a, b in zip(advs, micro, strict=True)]
        stats = dist_utils.all_reduce_sum([sum(p[i] for p in parts) for i in range(3)])
        n_adv = max(stats[0], 1.0)
        m["advantage_mean"] = stats[1] / n_adv
        m["advantage_std"] = math.sqrt(max(stats[2] / n_adv - m["advantage_mean"] ** 2, 0.0))
        if t.normalize_advantages:
            s3 = (stats[0], stats[1], stats[2])
            advs = [whiten(a, b.action_mask, s3, t.advantage_std_floor) for a, b in zip(advs, micro, strict=True)]
        # the signs the policy gradient sees, per turn, against each episode's outcome
        signs = [turn_sign_stats(a, b.action_mask, b.rewards) for a, b in zip(advs, micro, strict=True)]
        pos, solved, neg, failed = dist_utils.all_reduce_sum([sum(p[i] for p in signs) for i in range(4)])
        if solved:
            m["adv_pos_turns_solved"] = pos / solved
        if failed:
            m["adv_neg_turns_failed"] = neg / failed
        return advs

    def _gae(self, b: Batch, values: torch.Tensor, after: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Actor advantages with ``trainer.lam`` (or VAPO's length-adaptive lambda per row), critic returns with
        ``trainer.critic_lam``; one estimator call when the two lambdas agree. ``after`` (``value_after``): rows
        whose return is incomplete bootstrap from it in both; every other row takes V = 0 after its last token."""
        t = self.cfg.trainer
        inputs = gae_inputs(b, values, after, t.gamma, t.lam)
        adv, ret = self.adv_fn(inputs)
        if t.critic_lam != t.lam:
            ret = value_targets(self.adv_fn, b, values, after, t.gamma, t.critic_lam)
        if t.length_adaptive_lambda:
            adv, _ = advantages_per_row_lambda(self.adv_fn, inputs, row_lambdas(b.action_mask, t.lambda_alpha))
        # the state after each turn's action is a critic target too (``critic_mask``): what a cut bootstraps from
        return adv, ret if self.adv_traits.token_level else critic_returns(b, ret, after)

    def _policy_steps(
        self, micro: list[Batch], advs: list[torch.Tensor], probe: TokenProbe | None = None
    ) -> dict[str, float]:
        """The policy phase: ``trainer.ppo_epochs`` actor optimizer steps on the batch (the old-policy recompute,
        if the algorithm clips against one, happens once before the first). Tokens with a non-finite rollout or old
        logprob are masked out of the loss. ``probe`` keeps the first epoch's logprobs of its rows."""
        t = self.cfg.trainer
        olds: list[torch.Tensor | None] = [None] * len(micro)
        if self.loss_traits.needs_old_logp:
            with torch.no_grad():
                olds = [self._logp(b, False)[0] for b in micro]
        masks, rollout, bad = [], [], 0.0
        for b, old in zip(micro, olds, strict=True):
            ok = torch.isfinite(b.rollout_logprobs) & (True if old is None else torch.isfinite(old))
            bad += float((b.action_mask & ~ok).sum())
            masks.append(b.action_mask & ok)
            rollout.append(torch.where(ok, b.rollout_logprobs, 0.0))
        n_total, scale = token_scale(masks, self.grad_accum)
        m: dict[str, float] = {"masked_nonfinite_tokens": dist_utils.all_reduce_sum([bad])[0], "nonfinite_logp": 0.0}
        if n_total == 0:  # nothing left to train: no optimizer step (Adam's moments alone would still move weights)
            return {**m, "skipped_steps": float(self.cfg.policy_epochs), "trained_tokens": 0.0}
        if not t.entropy_coef and _no_signal(masks, advs):
            # every advantage is exactly 0 (e.g. GRPO groups that all earned the same reward): the loss has no
            # gradient, but an optimizer step would still move the weights by Adam's momentum, replaying earlier
            # updates batch after batch (measured: the collapse of GRPO in `sao bench stability`)
            return {
                **m,
                "skipped_steps": float(self.cfg.policy_epochs),
                "skipped_zero_advantage": 1.0,
                "trained_tokens": 0.0,
            }
        sums: dict[str, float] = {}
        skipped = 0
        for epoch in range(self.cfg.policy_epochs):
            seen = probe if epoch == 0 else None
            gn, was_skipped, bad_logp = self._policy_step(micro, masks, rollout, olds, advs, scale, sums, seen)
            skipped += int(was_skipped)
            m["nonfinite_logp"] += bad_logp
            m["actor_grad_norm"] = gn
        keys = sorted(sums)
        for k, total in zip(keys, dist_utils.all_reduce_sum([sums[k] for k in keys]), strict=True):
            m[k] = total / (n_total * self.cfg.policy_epochs)
        m["skipped_steps"] = float(skipped)
        m["trained_tokens"] = n_total
        return m

    def _policy_step(
        self,
        micro: list[Batch],
        masks: list[torch.Tensor],
        rollout: list[torch.Tensor],
        olds: list[torch.Tensor | None],
        advs: list[torch.Tensor],
        scale: float,
        sums: dict[str, float],
        probe: TokenProbe | None = None,
    ) -> tuple[float, bool, float]:
        """One actor optimizer step over the micro batches; adds token-weighted metric sums to ``sums``.
        Returns ``(grad norm, skipped, tokens whose recomputed logprob was not finite)``; such tokens are masked
        too (their gradient is then most likely not finite either, and the optimizer skips the step)."""
        t = self.cfg.trainer
        skipped0 = int(getattr(self.actor, "skipped_steps", 0))
        gn0: float | None = None
        bad_logp = 0.0
        for i, (b, mask0, old, adv, rl) in enumerate(zip(micro, masks, olds, advs, rollout, strict=True)):
            mark_boundary(self.actor, i, len(micro))
            logp, ent = self._logp(b, True)
            if probe is not None:
                probe.saw(i, logp)
            mask = mask0 & torch.isfinite(logp.detach())
            bad_logp += float((mask0 & ~mask).sum())
            loss, lm = self.loss_fn(
                PolicyLossInputs(
                    logp=torch.where(mask, logp, 0.0),
                    rollout_logp=rl,
                    advantages=torch.where(mask, adv, 0.0),
                    action_mask=mask,
                    old_logp=None if old is None else torch.where(mask, old, 0.0),
                    eps_low=self.ratio_bounds[0],
                    eps_high=self.ratio_bounds[1],
                    behavior_weight_cap=t.behavior_weight_cap,
                    # a loss that masks tokens applies the bonus itself, only to the tokens it trains
                    entropy=None if ent is None else torch.where(mask, ent, 0.0),
                    entropy_coef=t.entropy_coef,
                )
            )
            n_mb = float(mask.sum())
            ent_mean = float((ent.detach() * mask).sum() / max(n_mb, 1.0)) if ent is not None else 0.0
            if t.entropy_coef and ent is not None and not self.loss_traits.entropy_bonus:
                loss = loss - t.entropy_coef * torch.where(mask, ent, 0.0).sum() / max(n_mb, 1.0)
            self.actor.backward(loss * n_mb * scale)
            if i == len(micro) - 1 and plain_grads(self.actor):
                gn0 = full_grad_norm(self.actor)
            self.actor.step()  # DeepSpeed steps the optimizer only at the accumulation boundary
            vals: dict[str, float] = {k: float(x) for k, x in lm.items()}
            vals.update(entropy=ent_mean, pg_loss=float(loss.detach()))
            for k, val in vals.items():
                if k != "num_tokens" and math.isfinite(val):
                    sums[k] = sums.get(k, 0.0) + val * n_mb
        gn = self.actor.get_global_grad_norm()
        norm = float(gn) if gn is not None else float(gn0 or 0.0)
        skipped = int(getattr(self.actor, "skipped_steps", 0)) > skipped0
        return norm, skipped, dist_utils.all_reduce_sum([bad_logp])[0]

    def _critic_steps(
        self, micro: list[Batch], adv: _Advantages, first: tuple[float, float, bool] | None = None
    ) -> dict[str, float]:
        """The critic phase: K = ``critic_updates_per_step`` critic optimizer steps (``critic_step``) on the returns,
        and the explained variance of the values they started from. ``first``: the first of them, already taken with
        the values' forward (``_values_with_critic_step``)."""
        assert self.critic is not None
        n_total, scale = token_scale(adv.value_masks, self.grad_accum)
        if n_total == 0:
            return {"critic_skipped_steps": float(self.cfg.trainer.critic_updates_per_step)}
        losses: list[float] = []
        norm = 0.0
        skipped = 0
        for k in range(self.cfg.trainer.critic_updates_per_step):
            if k == 0 and first is not None:
                total, norm, was_skipped = first
            else:
                total, norm, was_skipped = critic_step(
                    self.critic, micro, adv.value_masks, adv.returns, adv.old_values, self.cfg.critic.value_clip, scale,
                    features=self._features if self._head_only else None,
                )  # fmt: skip
            losses.append(total)
            skipped += int(was_skipped)
        red = dist_utils.all_reduce_sum(losses)
        sums = explained_variance_sums(adv.old_values, adv.returns, adv.value_masks)
        ev = explained_variance_from_sums(dist_utils.all_reduce_sum(sums))
        return {
            "value_loss": red[-1] / n_total,
            "value_loss_first": red[0] / n_total,
            "critic_grad_norm": norm,
            "critic_skipped_steps": float(skipped),
            "explained_variance": ev,
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
        return dist_utils.full_state_dict(engine.module, self.cfg.deepspeed.zero_stage)

    def params_finite(self) -> bool:
        """Collective: whether every rank's (shard of the) actor and critic parameters is finite: a checkpoint
        of weights that are not is never written."""
        bad = 0.0
        for eng in (self.actor, self.critic):
            if eng is not None:
                bad += sum(float((~torch.isfinite(p.detach())).sum()) for p in eng.module.parameters())
        return dist_utils.all_reduce_sum([bad])[0] == 0


# -- the critic step (shared with value pretraining) -------------------------------------------------------------


def critic_step(
    engine: Any,
    micro: list[Batch],
    masks: list[torch.Tensor],
    returns: list[torch.Tensor],
    old_values: list[torch.Tensor] | None,
    clip: float | None,
    scale: float,
    seen: list[torch.Tensor] | None = None,
    features: list[torch.Tensor | None] | None = None,
) -> tuple[float, float, bool]:
    """One critic optimizer step over the micro batches (value loss on ``masks``); returns ``(sum of token losses,
    grad norm, skipped)``. ``old_values`` (the values before the K steps) anchor the value clip; None: no clip.
    ``seen`` collects the (pre-step) values of each micro batch. ``features``: per micro batch, a head-only critic's
    frozen features where already read (``ValueModel.forward``), else None."""
    total = 0.0
    gn0: float | None = None
    skipped0 = int(getattr(engine, "skipped_steps", 0))
    for i, (b, mask, ret) in enumerate(zip(micro, masks, returns, strict=True)):
        mark_boundary(engine, i, len(micro))
        cached = None if features is None else features[i]
        if cached is None:
            out = engine(b.input_ids, b.attention_mask, b.position_ids)
        else:
            out = engine(b.input_ids, b.attention_mask, b.position_ids, features=cached)
        values = shifted_values(out)
        if seen is not None:
            seen.append(values.detach())
        total += _critic_backward(engine, values, mask, None if old_values is None else old_values[i], ret, clip, scale)
        if i == len(micro) - 1 and plain_grads(engine):
            gn0 = full_grad_norm(engine)
        engine.step()  # DeepSpeed steps the optimizer only at the accumulation boundary
    return (total, *_step_outcome(engine, gn0, skipped0))


def _critic_backward(
    engine: Any,
    values: torch.Tensor,
    mask: torch.Tensor,
    old: torch.Tensor | None,
    ret: torch.Tensor,
    clip: float | None,
    scale: float,
    poison: bool = False,
) -> float:
    """One micro batch of a critic step: the value loss of ``values`` (shifted, with their graph) on ``mask`` against
    ``ret``, clipped around ``old`` (None: no clip), and its backward; returns the loss summed over its tokens.
    ``poison``: the backward's loss is made NaN, so the optimizer skips this step (the batch must not train)."""
    ok = mask & torch.isfinite(values.detach())
    anchor = values.detach() if old is None else old
    loss, _ = value_loss(values, torch.where(ok, anchor, 0.0), ret, ok, clip if old is not None else None)
    n_mb = float(ok.sum())
    engine.backward(loss * n_mb * scale * (math.nan if poison else 1.0))
    return float(loss.detach()) * n_mb


def _step_outcome(engine: Any, gn0: float | None, skipped0: int) -> tuple[float, bool]:
    """(the step's gradient norm: DeepSpeed's, else ``gn0`` read off the parameters; whether the optimizer skipped
    it: ``engine.skipped_steps`` rose above ``skipped0``)."""
    gn = engine.get_global_grad_norm()
    norm = float(gn) if gn is not None else float(gn0 or 0.0)
    return norm, int(getattr(engine, "skipped_steps", 0)) > skipped0


# -- batch checks -----------------------------------------------------------------------------------------------


def _no_signal(masks: list[torch.Tensor], advs: list[torch.Tensor]) -> bool:
    """Every trainable token of the batch, on every rank, has an advantage of exactly 0."""
    local = sum(float((a.abs() * m).sum()) for m, a in zip(masks, advs, strict=True))
    return dist_utils.all_reduce_sum([local])[0] == 0.0


def _uniform_rewards(full: Batch, bad: list[int]) -> bool:
    """Every trajectory of the batch (non-finite ones aside) earned the same total reward: no outcome signal."""
    keep = [i for i in range(full.shape[0]) if i not in set(bad)]
    totals = full.rewards[keep].double().sum(-1) if keep else full.rewards.new_zeros(0)
    return bool(totals.numel() == 0 or float(totals.max() - totals.min()) == 0.0)


def baseline_keys(trajs: list[Trajectory], field: str) -> tuple[str, ...] | None:
    """The running-mean key of each row (``trainer.baseline_key``): the episode info's ``field``, as text; None
    where no field is set. An episode without it is an error that names the field and the fix (one without a
    finite reward, which no baseline reads, gets an empty key)."""
    if not field:
        return None
    missing = [tr.task_id for tr in trajs if field not in tr.info and _finite_reward(tr)]
    if missing:
        raise ConfigError(
            f"trainer.baseline_key {field!r}: episode info has no {field!r} (tasks {missing[:3]}); key the running "
            "mean by a field the env writes into every episode's info (the arithmetic_chain tasks write 'level') "
            "or clear trainer.baseline_key"
        )
    return tuple(str(tr.info.get(field, "")) for tr in trajs)


def _finite_reward(tr: Trajectory) -> bool:
    return all(math.isfinite(x) for x in [tr.reward, *(s.reward for s in tr.segments if s.reward is not None)])


def _zero_reward(tr: Trajectory) -> Trajectory:
    segs = tuple(dataclasses.replace(s, reward=None) if s.reward is not None else s for s in tr.segments)
    return dataclasses.replace(tr, reward=0.0, segments=segs)
