"""sao.agent.engines.weight_sync: bucket planning, a real gloo broadcast between two group members, the timeouts."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from sao.agent.engines.weight_sync import (
    BucketSender,
    SyncPlan,
    TensorSpec,
    WeightSyncError,
    destroy_group,
    init_group,
    plan_buckets,
    receive,
    send_all,
)
from tests.conftest import free_port


def spec(name: str, n: int, dtype: str = "float32") -> TensorSpec:
    return TensorSpec(name, (n,), dtype)


def test_buckets_are_consecutive_same_dtype_and_bounded() -> None:
    specs = [spec("a", 10), spec("b", 10), spec("c", 30), spec("d", 5, "bfloat16"), spec("e", 5, "bfloat16")]
    buckets = plan_buckets(specs, bucket_bytes=80)
    assert [[s.name for s in b] for b in buckets] == [["a", "b"], ["c"], ["d", "e"]]
    assert [s.name for b in buckets for s in b] == [s.name for s in specs]  # order kept
    assert [[s.name for s in b] for b in plan_buckets(specs, 0)] == [["a"], ["b"], ["c"], ["d"], ["e"]]


def test_plan_survives_json() -> None:
    import json

    plan = SyncPlan(3, "127.0.0.1", 1234, 2, plan_buckets([spec("w", 4), TensorSpec("m", (2, 3), "float32")], 1 << 20))
    assert SyncPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert plan.num_tensors == 2 and plan.nbytes == 40


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "model.embed.weight": torch.randn(7, 5, generator=g),
        "model.layers.0.w": torch.randn(5, 5, generator=g),
        "model.layers.0.b": torch.randn(5, generator=g),
        "model.norm.weight": torch.randn(5, generator=g).to(torch.bfloat16),
    }


@pytest.mark.parametrize("bucket_bytes", [0, 64, 1 << 20])
def test_broadcast_between_two_members_delivers_every_tensor_exactly(bucket_bytes: int) -> None:
    tensors = _tensors()
    specs = [TensorSpec(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in tensors.items()]
    plan = SyncPlan(1, "127.0.0.1", free_port(), 2, plan_buckets(specs, bucket_bytes), timeout_s=30)
    got: dict[str, torch.Tensor] = {}
    errors: list[BaseException] = []

    def engine_side() -> None:
        try:
            pg = init_group(plan, 1)
            try:
                got.update(receive(pg, plan))
            finally:
                destroy_group(pg)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=engine_side)
    t.start()
    pg = init_group(plan, 0)
    try:
        sent = send_all(pg, plan, tensors.items())
    finally:
        destroy_group(pg)
    t.join(30)
    assert not errors, errors
    assert sent == plan.nbytes
    assert list(got) == list(tensors)
    for k, v in tensors.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k


def test_sender_refuses_a_tensor_out_of_plan_order() -> None:
    plan = SyncPlan(1, "127.0.0.1", 1, 2, plan_buckets([spec("a", 2), spec("b", 2)], 1 << 20))
    sender = BucketSender(pg=None, plan=plan)
    with pytest.raises(WeightSyncError, match=r"'b'.*where the plan has 'a'"):
        sender.add("b", torch.zeros(2))


def test_a_missing_engine_is_an_error_after_the_timeout_not_a_hang() -> None:
    plan = SyncPlan(5, "127.0.0.1", free_port(), 2, plan_buckets([spec("a", 2)], 0), timeout_s=2)
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError, match="did not all join"):
        init_group(plan, 0)
    assert time.monotonic() - t0 < 30
