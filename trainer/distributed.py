"""Process-group setup for the trainer: works unlaunched (single process) and under torchrun / deepspeed launchers."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_launch_env() -> None:
    """Fill RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT for an unlaunched run (DeepSpeed would otherwise
    try MPI discovery), and point TORCH_EXTENSIONS_DIR at SAO's cache so JIT ops are built once per machine."""
    from sao.core.paths import torch_extensions_dir

    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(torch_extensions_dir()))


def init_distributed() -> None:
    """Start the process group once: NCCL when CUDA is present, gloo otherwise."""
    ensure_launch_env()
    import deepspeed
    import torch.distributed as dist

    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_initialized() else 1


def device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (a no-op in a single process)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_reduce_sum(values: list[float]) -> list[float]:
    """Element-wise sum of a list of floats over all ranks."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device() if torch.cuda.is_available() else "cpu")
    dist.all_reduce(t)
    return [float(x) for x in t.tolist()]


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


@contextmanager
def full_parameters(module: torch.nn.Module, zero_stage: int) -> Iterator[None]:
    """Collective under ZeRO-3: inside the block every rank holds ``module``'s full parameters (read-only);
    a plain block for stages 0-2, where every rank already holds them. The one ZeRO-3 gather of the trainer."""
    if zero_stage != 3:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
        yield


def full_state_dict(
    module: torch.nn.Module, zero_stage: int, all_ranks: bool = False
) -> dict[str, torch.Tensor] | None:
    """Collective: ``module``'s full state dict as CPU copies on rank 0 (on every rank with ``all_ranks``), None
    elsewhere. Every rank must call it (ZeRO-3 gathers the shards)."""
    with full_parameters(module, zero_stage):
        if not all_ranks and rank() != 0:
            return None
        return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
