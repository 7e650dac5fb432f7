"""In-memory weight sync, trainer -> vLLM engines, over a process group made for it (gloo on CPU, NCCL on GPU).

The trainer (rank 0 of the group) and every engine worker (ranks 1..N) meet in a *stateless* process group
(vLLM's ``stateless_init_torch_distributed_process_group``: the vLLM worker already has its own torch.distributed
world, and so may the trainer). The trainer announces a ``SyncPlan``: the tensors' names, shapes and dtypes in
send order, cut into buckets of at most ``bucket_bytes``; then broadcasts one flat buffer per bucket. A worker
receives the buckets, splits them back into named tensors and loads them (``vllm_worker_ext``). Nothing touches
a filesystem, so trainer and engines need not share one.

Every wait is bounded by ``SyncPlan.timeout_s`` (joining the group, each bucket): a dead or missing engine gives
a ``WeightSyncError`` naming the step, never a hang. Sender and receiver must follow the same plan; ``BucketSender``
checks every tensor it is given against it (name, shape, dtype, order).
"""

from __future__ import annotations

import dataclasses
import math
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch


class WeightSyncError(RuntimeError):
    """A weight sync did not complete; the message names the step and what to check."""


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the sync: its parameter name as the HF checkpoint spells it, shape and dtype name."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * _dtype(self.dtype).itemsize


@dataclass(frozen=True)
class SyncPlan:
    """What one sync sends, and where the group meets (``host:port`` is the trainer's rendezvous)."""

    version: int
    host: str
    port: int
    world_size: int
    """1 (the trainer) + every engine worker."""
    buckets: tuple[tuple[TensorSpec, ...], ...]
    backend: str = "gloo"
    timeout_s: float = 120.0

    @property
    def num_tensors(self) -> int:
        return sum(len(b) for b in self.buckets)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for b in self.buckets for s in b)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (it crosses HTTP to the engines' ``/collective_rpc``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SyncPlan:
        buckets = tuple(
            tuple(TensorSpec(str(s["name"]), tuple(int(x) for x in s["shape"]), str(s["dtype"])) for s in b)
            for b in d["buckets"]
        )
        return cls(
            version=int(d["version"]),
            host=str(d["host"]),
            port=int(d["port"]),
            world_size=int(d["world_size"]),
            buckets=buckets,
            backend=str(d.get("backend", "gloo")),
            timeout_s=float(d.get("timeout_s", 120.0)),
        )


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise WeightSyncError(f"unknown tensor dtype {name!r} in the sync plan")
    return dt


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def plan_buckets(specs: Sequence[TensorSpec], bucket_bytes: int) -> tuple[tuple[TensorSpec, ...], ...]:
    """Cut ``specs`` (in send order) into consecutive same-dtype buckets of at most ``bucket_bytes``.

    A tensor larger than a bucket travels alone; ``bucket_bytes <= 0`` sends one tensor per bucket.
    """
    buckets: list[list[TensorSpec]] = []
    size = 0
    for s in specs:
        cur = buckets[-1] if buckets else None
        fits = cur is not None and cur[0].dtype == s.dtype and size + s.nbytes <= bucket_bytes
        if bucket_bytes > 0 and fits and cur is not None:
            cur.append(s)
            size += s.nbytes
        else:
            buckets.append([s])
            size = s.nbytes
    return tuple(tuple(b) for b in buckets)


def listen_socket() -> socket.socket:
    """A listening socket on a free port of every interface: the trainer's rendezvous (port = ``getsockname()[1]``)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("", 0))
    sock.listen()
    return sock


def init_group(plan: SyncPlan, rank: int, listen: socket.socket | None = None) -> Any:
    """Join the plan's stateless group as ``rank``. Rank 0 (the trainer) hosts the rendezvous store on ``listen``
    (from ``listen_socket()``, bound before the plan names its port: no race for the port); it also keeps a
    launcher's store out of the way (torchrun's TORCHELASTIC_USE_AGENT_STORE would make rank 0 a mere client)."""
    from vllm.distributed.utils import stateless_init_torch_distributed_process_group

    if rank == 0 and listen is None:
        listen = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listen.bind(("", plan.port))
        listen.listen()
    try:
        return stateless_init_torch_distributed_process_group(
            plan.host,
            plan.port,
            rank,
            plan.world_size,
            backend=plan.backend,
            listen_socket=listen if rank == 0 else None,
            timeout=timedelta(seconds=plan.timeout_s),
        )
    except Exception as e:  # the store raises DistStoreError / RuntimeError on a timeout
        who = "the engines did not all join" if rank == 0 else "could not reach the trainer's rendezvous"
        raise WeightSyncError(
            f"weight sync v{plan.version}: {who} {plan.host}:{plan.port} (world {plan.world_size}, rank {rank}) "
            f"within {plan.timeout_s:.0f} s ({type(e).__name__}: {e}); check that every engine runs the SAO worker "
            "extension and can reach that address (cluster.advertise_host), or raise rollout.sync_timeout_s"
        ) from e


def destroy_group(pg: Any) -> None:
    from vllm.distributed.utils import stateless_destroy_torch_distributed_process_group

    try:
        stateless_destroy_torch_distributed_process_group(pg)
    except Exception:  # a group whose peer died may refuse a clean shutdown; nothing is left to release
        pass


def _broadcast(pg: Any, flat: torch.Tensor, plan: SyncPlan, index: int) -> None:
    try:
        pg.broadcast(flat, 0).wait(timedelta(seconds=plan.timeout_s))
    except Exception as e:
        raise WeightSyncError(
            f"weight sync v{plan.version}: bucket {index + 1}/{len(plan.buckets)} did not complete within "
            f"{plan.timeout_s:.0f} s ({type(e).__name__}: {e}); an engine worker died or stalled"
        ) from e


class BucketSender:
    """Rank 0: take named tensors in plan order, broadcast each bucket as soon as it is full."""

    def __init__(self, pg: Any, plan: SyncPlan, device: torch.device | str = "cpu") -> None:
        self.pg, self.plan, self.device = pg, plan, torch.device(device)
        self._bucket, self._pos = 0, 0
        self._parts: list[torch.Tensor] = []
        self.sent_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if self._bucket >= len(self.plan.buckets):
            raise WeightSyncError(f"weight sync: {name!r} is not in the plan (all {self.plan.num_tensors} sent)")
        spec = self.plan.buckets[self._bucket][self._pos]
        if (name, tuple(tensor.shape), dtype_name(tensor.dtype)) != (spec.name, spec.shape, spec.dtype):
            raise WeightSyncError(
                f"weight sync: got {name!r} {tuple(tensor.shape)} {dtype_name(tensor.dtype)} where the plan has "
                f"{spec.name!r} {spec.shape} {spec.dtype}; the sender must follow the plan's order"
            )
        self._parts.append(tensor.detach().reshape(-1).to(self.device))
        self._pos += 1
        if self._pos == len(self.plan.buckets[self._bucket]):
            flat = torch.cat(self._parts) if len(self._parts) > 1 else self._parts[0].contiguous()
            _broadcast(self.pg, flat, self.plan, self._bucket)
            self.sent_bytes += flat.numel() * flat.element_size()
            self._parts, self._pos = [], 0
            self._bucket += 1

    def finish(self) -> None:
        if self._bucket != len(self.plan.buckets):
            missing = [s.name for b in self.plan.buckets[self._bucket :] for s in b][:5]
            raise WeightSyncError(f"weight sync: the sender stopped before the end of the plan (next: {missing})")


def receive(pg: Any, plan: SyncPlan, device: torch.device | str = "cpu") -> list[tuple[str, torch.Tensor]]:
    """Ranks >= 1: every tensor of the plan, received bucket by bucket, as (name, tensor)."""
    out: list[tuple[str, torch.Tensor]] = []
    for i, bucket in enumerate(plan.buckets):
        flat = torch.empty(sum(s.numel for s in bucket), dtype=_dtype(bucket[0].dtype), device=device)
        _broadcast(pg, flat, plan, i)
        offset = 0
        for s in bucket:
            out.append((s.name, flat[offset : offset + s.numel].view(s.shape)))
            offset += s.numel
    return out


def send_all(pg: Any, plan: SyncPlan, tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Rank 0: broadcast every (name, tensor) of ``tensors`` (plan order); returns the bytes sent."""
    sender = BucketSender(pg, plan)
    for name, t in tensors:
        sender.add(name, t)
    sender.finish()
    return sender.sent_bytes
