"""Shared helpers for the trainer tests: synthetic multi-turn trajectories with the actor's own logprobs."""

from __future__ import annotations

import random
from typing import Any

import torch

from sao.agent.records import Segment, Trajectory


def synthetic_trajectories(
    model: Any, n: int, seed: int = 0, version: int = 0, vocab: int = 500, temperature: float = 1.0
) -> list[Trajectory]:
    """``n`` two-turn trajectories of random tokens whose action logprobs come from ``model`` (teacher forced,
    logits / ``temperature``), so the DIS ratio starts at 1; rewards alternate 0/1; pairs share a group id."""
    from sao.trainer.algos.logprobs import token_logprobs

    rng = random.Random(seed)
    out = []
    for i in range(n):
        kinds = [("prompt", 6), ("action", 3), ("observation", 2), ("action", 3)]
        ids = [[rng.randrange(vocab) for _ in range(k)] for _, k in kinds]
        flat = torch.tensor([[t for seg in ids for t in seg]])
        with torch.no_grad():
            hidden = model(input_ids=flat, output_hidden_states=True).hidden_states[-1]
            lp, _ = token_logprobs(hidden, model.lm_head, flat, temperature=temperature)
        segs, pos = [], 0
        for (kind, k), toks in zip(kinds, ids, strict=True):
            if kind == "action":
                segs.append(Segment("action", toks, lp[0, pos : pos + k].tolist(), version, 0.0))
            else:
                segs.append(Segment(kind, toks))
            pos += k
        reward = float(i % 2)
        last = segs[-1]
        segs[-1] = Segment("action", last.token_ids, last.logprobs, version, reward)
        out.append(Trajectory(f"t{i}", "test", tuple(segs), reward, info={"solved": bool(reward)}, group_id=i // 2))
    return out
