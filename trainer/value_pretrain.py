"""Value pretraining: train only the critic on saved trajectories (returns from their recorded rewards).

Reads ``agent.records`` JSONL, a run's (or ``sao collect``'s) ``trajectories.jsonl`` (its ``trajectory`` records),
or a parquet file written by ``agent.records_arrow.write_parquet``; infra errors are skipped. Computes returns with
skip-observation GAE at lambda = 1 on zero values (the discounted reward-to-go over action tokens), runs ``epochs``
passes of the value loss on DeepSpeed and writes a critic checkpoint that ``critic.init`` accepts.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from agent.records import Trajectory
from saocore.jsonl import iter_jsonl
from trainer import distributed as dist_utils
from trainer.algos.advantages import skip_observation_gae
from trainer.batch import collate
from trainer.config import ConfigError, load_config
from trainer.engine import (
    critic_step,
    ev_from_parts,
    ev_parts,
    grad_accum_steps,
    make_engine,
    shard_batch,
    token_scale,
)


def read_rollouts(path: str | Path) -> list[Trajectory]:
    """Trajectories from a JSONL file of Trajectory records, a run's trajectories.jsonl, or a ``.parquet`` file of
    trajectories; infra errors and trajectories without actions skipped."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"--rollouts {str(p)!r} not found; pass a JSONL of trajectories (e.g. RUN_DIR/trajectories.jsonl) "
            "or a parquet file written by agent.records_arrow.write_parquet"
        )
    if p.suffix == ".parquet":
        from agent.records_arrow import read_parquet

        try:
            return _trainable(p, read_parquet(p))
        except ValueError as e:
            raise ConfigError(f"{p}: {e}") from e
    out = []
    for n, rec in iter_jsonl(p, error=ConfigError):
        if not isinstance(rec, dict):
            raise ConfigError(f"{p}:{n}: not a trajectory record (a JSON object was expected)")
        if rec.get("type") == "event" or rec.get("type") == "resume":
            continue
        body = rec.get("trajectory", rec)
        try:
            tr = Trajectory.from_dict(body)
        except (KeyError, ValueError, TypeError) as e:
            raise ConfigError(f"{p}:{n}: not a trajectory record ({e})") from e
        out.append(tr)
    return _trainable(p, out)


def _trainable(p: Path, trajs: list[Trajectory]) -> list[Trajectory]:
    out = [tr for tr in trajs if tr.status != "infra_error" and tr.action_segments]
    if not out:
        raise ConfigError(f"{p}: no trainable trajectories (all infra errors or no actions)")
    return out


def pretrain_value(
    config_path: str, rollouts: str, out_dir: str | None = None, epochs: int = 2, overrides: list[str] | None = None
) -> Path:
    """Train the critic of ``config_path`` on ``rollouts``; returns the checkpoint dir (default RUN_DIR/value_init).

    Batches of ``trainer.batch_size`` trajectories are sharded and accumulated exactly as the learner does
    (``shard_batch`` / ``token_scale`` / ``critic_step``); each batch is one critic optimizer step.
    """
    from trainer.models import load_actor, load_critic, load_tokenizer

    cfg = load_config(config_path, overrides)
    if epochs < 1:
        raise ConfigError("--epochs must be >= 1")
    trajs = read_rollouts(rollouts)
    out = Path(out_dir) if out_dir else Path(cfg.run.dir) / "value_init"
    dist_utils.init_distributed()
    torch.manual_seed(cfg.run.seed)
    tok = load_tokenizer(cfg)
    actor = load_actor(cfg)
    critic_model = load_critic(cfg, actor)
    del actor
    bs, mb = cfg.trainer.batch_size, cfg.deepspeed.micro_batch_size
    grad_accum = grad_accum_steps(bs, mb)
    critic = make_engine(critic_model, cfg, grad_accum, cfg.critic.lr, cfg.critic.weight_decay)
    rng = random.Random(cfg.run.seed)
    loss, ev = float("nan"), float("nan")
    for epoch in range(epochs):
        order = list(range(len(trajs)))
        rng.shuffle(order)
        # whole batches only (the accumulation count is fixed); fewer trajectories than a batch: one short batch
        for start in range(0, len(order) - bs + 1 if len(order) >= bs else 1, bs):
            micro = shard_batch(collate([trajs[i] for i in order[start : start + bs]], int(tok.pad_token_id)), mb)
            masks = [b.action_mask for b in micro]
            # returns: the discounted reward-to-go over action tokens (GAE at lambda = 1 on zero values)
            rets = [
                skip_observation_gae(b.rewards, torch.zeros_like(b.rewards), b.action_mask, cfg.trainer.gamma, 1.0)[1]
                for b in micro
            ]
            n_total, scale = token_scale(masks, grad_accum)
            values: list[torch.Tensor] = []
            total, _, _ = critic_step(critic, micro, masks, rets, None, None, scale, seen=values)
            loss = dist_utils.all_reduce_sum([total])[0] / max(n_total, 1.0)
            ev = ev_from_parts(dist_utils.all_reduce_sum(ev_parts(values, rets, masks)))
        if dist_utils.rank() == 0:
            print(f"value pretraining epoch {epoch + 1}/{epochs}: loss {loss:.4f} explained variance {ev:.3f}")
    sd = dist_utils.full_state_dict(critic.module, cfg.deepspeed.zero_stage)
    if sd is not None:
        critic.module.save(out, state=sd)
    dist_utils.barrier()
    return out
