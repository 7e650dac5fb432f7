"""One learner step on uneven trajectories that records the gradients each optimizer step applied; run in-process by
``test_microbatch.py`` and as each rank of a ``torch.distributed.run`` launch (``python -m ... OUT.pt TOKENS``)."""

from __future__ import annotations

import random
import sys
from typing import Any

import torch

from sao.agent.records import Segment, Trajectory
from sao.trainer.config import config_from_dict

# (prompt, action, observation, action) tokens per trajectory: 60, 35, 35 and 20 tokens. With a 70-token budget
# on two ranks, rank 0 gets [60] [20] and rank 1 [35, 35] plus an empty micro batch.
K = 2  # critic steps per train step: the second one sees the first one's update

SHAPES = [(10, 10, 30, 10), (5, 10, 10, 10), (5, 5, 20, 5), (4, 6, 4, 6)]


def uneven_trajectories(model: Any, seed: int = 0, vocab: int = 500) -> list[Trajectory]:
    """Multi-turn trajectories of ``SHAPES`` with the model's own logprobs (DIS ratio 1), rewards 0/1 alternating."""
    from sao.trainer.algos.logprobs import token_logprobs

    rng = random.Random(seed)
    out = []
    for i, sizes in enumerate(SHAPES):
        kinds = ("prompt", "action", "observation", "action")
        ids = [[rng.randrange(vocab) for _ in range(k)] for k in sizes]
        flat = torch.tensor([[t for seg in ids for t in seg]])
        with torch.no_grad():
            lp, _ = token_logprobs(
                model(input_ids=flat, output_hidden_states=True).hidden_states[-1], model.lm_head, flat
            )
        segs, pos = [], 0
        for kind, toks in zip(kinds, ids, strict=True):
            last = pos + len(toks) == flat.shape[1]
            if kind == "action":
                segs.append(
                    Segment("action", toks, lp[0, pos : pos + len(toks)].tolist(), 0, float(i % 2) if last else None)
                )
            else:
                segs.append(Segment(kind, toks))
            pos += len(toks)
        out.append(Trajectory(f"t{i}", "test", tuple(segs), float(i % 2), group_id=i // 2))
    return out


def learner(algorithm: str, micro_batch_size: int, micro_batch_tokens: int) -> Any:
    from sao.trainer import distributed
    from sao.trainer.learn.learner import Learner
    from sao.trainer.learn.models import load_actor, load_critic

    distributed.init_distributed()
    cfg = config_from_dict(
        {
            "model": {"path": "tiny:llama"},
            "trainer": {
                "algorithm": algorithm,
                "batch_size": 4,
                "group_size": 2,
                "lr": 1e-3,
                "critic_updates_per_step": K,
            },
            "deepspeed": {"micro_batch_size": micro_batch_size, "micro_batch_tokens": micro_batch_tokens},
        }
    )
    actor = load_actor(cfg)
    critic = load_critic(cfg, actor) if cfg.uses_critic else None
    return Learner(cfg, actor, critic, pad_token_id=0)


def record_steps(lrn: Any) -> dict[str, list[dict[str, torch.Tensor]]]:
    """Each engine's optimizer steps, as the gradients they were given (after DeepSpeed's reduction and clip)."""
    seen: dict[str, list[dict[str, torch.Tensor]]] = {}
    for name in ("actor", "critic"):
        engine = getattr(lrn, name)
        if engine is None:
            continue
        seen[name] = []
        inner = engine.optimizer.step

        def step(*a: Any, _inner: Any = inner, _engine: Any = engine, _name: str = name, **kw: Any) -> Any:
            grads = {k: p.grad.detach().clone() for k, p in _engine.module.named_parameters() if p.grad is not None}
            seen[_name].append(grads)
            return _inner(*a, **kw)

        engine.optimizer.step = step
    return seen


def step_gradients(algorithm: str, micro_batch_size: int, micro_batch_tokens: int) -> dict[str, Any]:
    lrn = learner(algorithm, micro_batch_size, micro_batch_tokens)
    seen = record_steps(lrn)
    metrics = lrn.train_step(uneven_trajectories(lrn.actor.module))
    return {"steps": seen, "trained_tokens": metrics["trained_tokens"]}


if __name__ == "__main__":
    from sao.trainer import distributed

    out = step_gradients("sao", 8, int(sys.argv[2]))
    if distributed.rank() == 0:
        torch.save(out, sys.argv[1])
