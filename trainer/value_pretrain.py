"""Value pretraining: train only the critic on saved trajectories (returns from their recorded rewards).

Reads ``agent.records`` JSONL or a run's ``trajectories.jsonl`` (its ``trajectory`` records; infra errors are
skipped), computes returns with skip-observation GAE at lambda = 1 on zero values (the discounted reward-to-go
over action tokens), runs ``epochs`` passes of the value loss on DeepSpeed and writes a critic checkpoint that
``critic.init`` accepts.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from agent.records import Trajectory
from saocore.jsonl import iter_jsonl
from trainer import distributed as dist_utils
from trainer.algos.advantages import skip_observation_gae
from trainer.algos.losses import explained_variance, value_loss
from trainer.batching import collate
from trainer.config import ConfigError, load_config
from trainer.learner import make_engine
from trainer.models import shifted_values


def read_rollouts(path: str | Path) -> list[Trajectory]:
    """Trajectories from a JSONL file of Trajectory records or a run's trajectories.jsonl; infra errors skipped."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"--rollouts {str(p)!r} not found; pass a JSONL of trajectories (e.g. RUN_DIR/trajectories.jsonl)"
        )
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
        if tr.status != "infra_error" and tr.action_segments:
            out.append(tr)
    if not out:
        raise ConfigError(f"{p}: no trainable trajectories (all infra errors or no actions)")
    return out


def pretrain_value(
    config_path: str, rollouts: str, out_dir: str | None = None, epochs: int = 2, overrides: list[str] | None = None
) -> Path:
    """Train the critic of ``config_path`` on ``rollouts``; returns the checkpoint dir (default RUN_DIR/value_init)."""
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
    bs, world, rank = cfg.trainer.batch_size, dist_utils.world_size(), dist_utils.rank()
    mb = cfg.deepspeed.micro_batch_size
    shard = max(1, bs // world)
    grad_accum = -(-shard // mb)
    critic = make_engine(critic_model, cfg, grad_accum, cfg.critic.lr, cfg.critic.weight_decay)
    rng = random.Random(cfg.run.seed)
    dev = dist_utils.device()
    ev = float("nan")
    for epoch in range(epochs):
        order = list(range(len(trajs)))
        rng.shuffle(order)
        for start in range(0, len(order) - bs + 1 if len(order) >= bs else 1, bs):
            batch = [trajs[i] for i in order[start : start + bs]]
            full = collate(batch, int(tok.pad_token_id))
            mine = list(range(rank, len(batch), world))
            chunks = [mine[i : i + mb] for i in range(0, len(mine), mb)]
            n_total = max(1.0, dist_utils.all_reduce_sum([float(full.action_mask[mine].sum())])[0])
            for rows in chunks:
                b = full.rows(rows)
                ids, am, pos = b.input_ids.to(dev), b.attention_mask.to(dev), b.position_ids.to(dev)
                mask = b.action_mask.to(dev)
                _, ret = skip_observation_gae(
                    b.rewards.to(dev), torch.zeros_like(b.rewards, device=dev), mask, cfg.trainer.gamma, 1.0
                )
                values = shifted_values(critic(ids, am, pos))
                loss, _ = value_loss(values, values.detach(), ret, mask, None)
                critic.backward(loss * float(mask.sum()) * grad_accum * world / n_total)
                critic.step()
                ev = float(explained_variance(values.detach(), ret, mask))
        if rank == 0:
            print(
                f"value pretraining epoch {epoch + 1}/{epochs}: "
                f"loss {float(loss.detach()):.4f} explained variance {ev:.3f}"
            )
    from deepspeed import zero

    module = critic.module
    if cfg.deepspeed.zero_stage == 3:
        with zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            sd = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
    else:
        sd = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
    if rank == 0:
        module.save(out, state=sd)
    dist_utils.barrier()
    return out
