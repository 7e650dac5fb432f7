"""Trainer side of the in-memory weight sync: plan the tensors, gather ZeRO-3 shards a layer at a time, send.

``make_plan`` runs on rank 0 before a sync (shapes come from ``ds_shape`` under ZeRO-3, so nothing is gathered);
``push`` is a collective of every trainer rank (each layer's shards are gathered together), and only rank 0,
which holds the weight-sync group, broadcasts to the engines. A send that fails on rank 0 does not stop the
gathers (the other ranks would wait in them forever): rank 0 keeps gathering, sends nothing more, and raises at
the end.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from typing import Any

import torch

from sao.agent.engines.weight_sync import BucketSender, SyncPlan, TensorSpec, WeightSyncError, dtype_name, plan_buckets
from sao.trainer.runs.commands import PushWeights

_LAYER = re.compile(r"^(.*?\.\d+)\.")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _shape(p: torch.nn.Parameter) -> tuple[int, ...]:
    ds_shape = getattr(p, "ds_shape", None)  # a ZeRO-3 partitioned parameter is empty outside a gather
    return tuple(int(x) for x in (ds_shape if ds_shape is not None else p.shape))


def tensor_specs(module: torch.nn.Module) -> list[TensorSpec]:
    """Every parameter in send order (tied parameters once, as ``named_parameters`` lists them)."""
    return [TensorSpec(n, _shape(p), dtype_name(p.dtype)) for n, p in module.named_parameters()]


def make_plan(
    module: torch.nn.Module,
    version: int,
    *,
    host: str,
    port: int,
    world_size: int,
    bucket_mb: float,
    timeout_s: float,
    backend: str | None = None,
) -> SyncPlan:
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    buckets = plan_buckets(tensor_specs(module), int(bucket_mb * 2**20))
    return SyncPlan(version, host, port, world_size, buckets, backend=backend, timeout_s=timeout_s)


def layer_groups(module: torch.nn.Module) -> Iterator[tuple[torch.nn.Module, list[tuple[str, torch.nn.Parameter]]]]:
    """Consecutive parameters grouped by layer (``model.layers.3.*`` together; others one by one), each with the
    submodule that holds them (what a ZeRO-3 gather of that group gathers)."""
    group: list[tuple[str, torch.nn.Parameter]] = []
    key: str | None = None
    for name, p in module.named_parameters():
        m = _LAYER.match(name)
        k = m.group(1) if m else name.rpartition(".")[0]
        if group and k != key:
            yield module.get_submodule(key or ""), group
            group = []
        group.append((name, p))
        key = k
    if group:
        yield module.get_submodule(key or ""), group


def push(module: torch.nn.Module, pg: Any, plan: SyncPlan, *, zero3: bool, device: Any = "cpu") -> dict[str, float]:
    """Collective over the trainer ranks; rank 0 passes its weight-sync group ``pg`` (others pass None). Each
    layer is gathered with the trainer's one ZeRO-3 gather (``sao.trainer.distributed.full_parameters``), sent, and
    released before the next: the full model is never resident at once."""
    from sao.trainer.distributed import full_parameters

    t0 = time.perf_counter()
    sender = BucketSender(pg, plan, device) if pg is not None else None
    error: BaseException | None = None
    for holder, group in layer_groups(module):
        with full_parameters(holder, 3 if zero3 else 0):
            if sender is None or error is not None:
                continue
            try:
                for name, p in group:
                    sender.add(name, p.data)
            except BaseException as e:  # keep gathering in lockstep with the other ranks
                error = e
    if sender is not None and error is None:
        try:
            sender.finish()
        except BaseException as e:
            error = e
    if error is not None:
        raise error if isinstance(error, WeightSyncError) else WeightSyncError(str(error))
    sent = sender.sent_bytes if sender is not None else 0
    return {"sync_send_s": time.perf_counter() - t0, "sync_bytes": float(sent)}


class BroadcastSync:
    """Rank 0's end of ``rollout.weight_sync: broadcast``: one group per sync, the engines receive meanwhile.

    ``lead`` runs a learner command on every rank (``Trainer.lead``); the command ``PushWeights`` must call
    ``push(actor_module, self.pg, plan, ...)`` on rank 0 and ``push(actor_module, None, plan, ...)`` elsewhere.
    """

    def __init__(self, module: torch.nn.Module, *, host: str, bucket_mb: float, timeout_s: float) -> None:
        self.module, self.host, self.bucket_mb, self.timeout_s = module, host, bucket_mb, timeout_s
        self.pg: Any = None

    @classmethod
    def for_config(cls, cfg: Any, module: torch.nn.Module) -> BroadcastSync:
        """Rendezvous on ``cluster.advertise_host``, else on rank 0's DeepSpeed master address (its own node)."""
        import os

        host = cfg.cluster.advertise_host or os.environ.get("MASTER_ADDR", "127.0.0.1")
        r = cfg.rollout
        return cls(module, host=host, bucket_mb=r.sync_bucket_mb, timeout_s=r.sync_timeout_s)

    async def sync(self, engine: Any, version: int, lead: Any) -> dict[str, float]:
        """Send the actor's weights as ``version`` to every server of ``engine`` (a ``VLLMEngine``)."""
        import asyncio

        from sao.agent.engines.weight_sync import destroy_group, init_group, listen_socket

        t0 = time.perf_counter()
        listen = listen_socket()
        plan = make_plan(
            self.module,
            version,
            host=self.host,
            port=int(listen.getsockname()[1]),
            world_size=engine.sync_world_size,
            bucket_mb=self.bucket_mb,
            timeout_s=self.timeout_s,
        )
        receiving = asyncio.ensure_future(engine.receive_weights(plan))
        joining = asyncio.ensure_future(asyncio.to_thread(init_group, plan, 0, listen))
        done, _ = await asyncio.wait({receiving, joining}, return_when=asyncio.FIRST_COMPLETED)
        refused = receiving.exception() if receiving in done else None
        if refused is not None:  # an engine failed before the group formed: fail now, not after the join timeout
            joining.add_done_callback(_destroy_if_formed)
            raise refused
        try:
            self.pg = await joining
        except BaseException:
            receiving.cancel()
            raise
        try:
            out = await asyncio.to_thread(lead, PushWeights(plan))
        except BaseException:
            receiving.cancel()
            raise
        finally:
            destroy_group(self.pg)
            self.pg = None
        await receiving
        return {**out, "sync_s": time.perf_counter() - t0}


def push_command(
    module: torch.nn.Module, syncer: BroadcastSync | None, plan: SyncPlan, zero3: bool
) -> dict[str, float]:
    """The learner command ``PushWeights`` on any rank (rank 0 holds ``syncer`` with its group; others None)."""
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    return push(module, syncer.pg if syncer is not None else None, plan, zero3=zero3, device=device)


def _destroy_if_formed(fut: Any) -> None:
    from sao.agent.engines.weight_sync import destroy_group

    if not fut.cancelled() and fut.exception() is None:
        destroy_group(fut.result())
