"""torchrun helper of test_zero3_push: 2 ranks, ZeRO-3 tiny Llama; push() gathers a layer at a time, rank 0 sends
to a receiver thread (group rank 1); rank 0 writes whether every tensor arrived equal to the gathered weights."""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

import deepspeed
import torch

from sao.agent.engines.weight_sync import SyncPlan, destroy_group, init_group, receive
from sao.core.tiny_models import build_tiny_model
from sao.trainer import distributed as dist_utils
from sao.trainer.cluster.weights import make_plan, push


def main(out: str, port: int) -> None:
    dist_utils.init_distributed()
    # The receiver thread plays an engine, which runs outside torchrun: keep it off the launcher's agent store.
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    model = build_tiny_model("llama", seed=0)
    ds_cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3},
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_cfg)
    module = engine.module
    shapes_partitioned = any(p.numel() != torch.Size(p.ds_shape).numel() for p in module.parameters())
    plan = make_plan(module, 1, host="127.0.0.1", port=port, world_size=2, bucket_mb=0.05, timeout_s=60)
    plan = SyncPlan.from_dict(dist_utils.broadcast_object(plan.to_dict()))
    got: dict[str, Any] = {}
    pg = None
    if dist_utils.rank() == 0:

        def engine_side() -> None:
            g = init_group(plan, 1)
            try:
                got.update(receive(g, plan))
            finally:
                destroy_group(g)

        t = threading.Thread(target=engine_side)
        t.start()
        pg = init_group(plan, 0)
    stats = push(module, pg, plan, zero3=True)
    full = dist_utils.full_state_dict(module, 3)
    if dist_utils.rank() == 0:
        t.join(60)
        destroy_group(pg)
        assert full is not None
        names = [n for n, _ in module.named_parameters()]
        equal = all(torch.equal(got[n], full[n]) for n in names)
        res = {
            "partitioned": shapes_partitioned,
            "tensors": len(got),
            "expected": len(names),
            "equal": equal,
            "buckets": len(plan.buckets),
            **stats,
        }
        with open(out, "w") as f:
            json.dump(res, f)
    dist_utils.barrier()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
