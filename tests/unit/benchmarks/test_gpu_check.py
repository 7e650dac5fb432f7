"""The GPU check's pure parts: its FLOP model against torch's FLOP counter, the time-budget guess, the torch-Adam
fallback config and the report (parts, JUnit results, table, verdict)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from sao.benchmarks.gpu_check import _time_for, values_bf16_rounded, with_torch_adam
from sao.benchmarks.gpu_check_flops import FlopShape, step_flops
from sao.benchmarks.gpu_check_report import junit_cases, log_tail, ok, parse_parts, render
from sao.core.tiny_models import build_tiny_model


@pytest.mark.parametrize("kind", ["llama", "moe"])
def test_forward_flops_match_torchs_flop_counter(kind: str) -> None:
    # eager attention: the score and value products are plain matmuls over the full T x T (twice the causal count);
    # eager experts: one matmul per expert (the counter does not see the grouped_mm kernel)
    model = build_tiny_model(kind, vocab_size=512, attn_implementation="eager", experts_implementation="eager").eval()
    t = 48
    ids = torch.randint(0, 512, (1, t))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids)
    shape = FlopShape.of(model.config)
    expected = shape.linear_flops(t) + 2 * shape.attention_flops(t) + shape.head_flops(t)
    assert counter.get_total_flops() == expected


def test_step_flops_count_backward_twice_and_skip_frozen_attention_weights() -> None:
    shape = FlopShape.of(build_tiny_model("llama", vocab_size=512).config)
    fl = step_flops(shape, tokens=100, action_tokens=40, k=2)
    fwd = shape.forward_flops(100)
    assert fl["values"] == fwd
    assert fl["actor"] == 3 * fwd + 3 * shape.head_flops(40)
    assert fl["critic"] == 2 * (3 * fwd - shape.frozen_weight_grad_flops(100))
    assert 0 < shape.frozen_weight_grad_flops(100) < fwd


def test_a_step_is_started_only_when_it_likely_fits() -> None:
    done = [{"tokens": 1000, "step_s": 1.0}]
    assert _time_for(1000, [], left=6, repeats=2)
    assert not _time_for(1000, [], left=4, repeats=2)
    assert _time_for(2000, done, left=3 * 4 + 6, repeats=2)  # 2 repeats + 1 of a step 4x longer (length squared)
    assert not _time_for(2000, done, left=3 * 4 + 4, repeats=2)
    assert not _time_for(2000, done, left=3 * 4 + 6, repeats=3)
    assert _time_for(2000, [*done, {"tokens": 1500, "skipped": "OOM"}], left=3 * 4 + 6, repeats=2)  # judged by 1000


def test_torch_adam_fallback_only_touches_a_deepspeed_optimizer() -> None:
    def conf(with_opt: bool) -> dict[str, Any]:
        return {"optimizer": {"type": "AdamW", "params": {"lr": 1.0}}} if with_opt else {"bf16": {}}

    assert with_torch_adam(conf)(True)["optimizer"]["params"] == {"lr": 1.0, "torch_adam": True}
    assert with_torch_adam(conf)(False) == {"bf16": {}}


def test_parts_spec_is_parsed_and_bad_items_are_named() -> None:
    assert parse_parts(" install=0:12 tests=124:150 bench=skip:0") == {
        "install": {"rc": 0, "seconds": 12.0},
        "tests": {"rc": 124, "seconds": 150.0},
        "bench": {"rc": None, "seconds": 0.0},
    }
    with pytest.raises(ValueError, match="'tests=1' is not name=rc:seconds"):
        parse_parts("tests=1")


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.a" name="test_ok" time="1.0"/>
<testcase classname="tests.a" name="test_bad" time="1.0">
<failure message="AssertionError: moved nothing">tb</failure></testcase>
<testcase classname="tests.b" name="test_gpus" time="0">
<skipped type="pytest.skip" message="needs 2 CUDA GPU(s); found 1"/></testcase>
</testsuite></testsuites>"""


def _bench(steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "mode": "gpu",
        "device": "NVIDIA H200",
        "lengths": [8192, 32768],
        "matmul": {"n": 8192, "iters": 10, "tflops": 790.0},
        "models": {
            "dense": {
                "params": 357e6,
                "steps": steps,
                "optimizer": "FusedAdam",
                "critic_head_dtype_before": "float32",
                "critic_head_dtype": "bfloat16",
                "critic_values_bf16_rounded": False,
                "logprob_memory": [{"tokens": 8192, "naive": 30 * 2**30, "chunked": 2**30, "backbone": 2**29}],
            }
        },
    }


STEP = {
    "tokens": 8192,
    "step_s": 0.5,
    "phases_s": {"values": 0.05, "actor": 0.2, "critic": 0.2, "other": 0.05},
    "tokens_per_s": 16384.0,
    "mfu": 0.31,
    "peak_bytes": 20 * 2**30,
}


def test_report_lists_failures_skips_timeouts_and_the_head_dtype(tmp_path: Path) -> None:
    (tmp_path / "tests.xml").write_text(JUNIT)
    cases = junit_cases(tmp_path / "tests.xml")
    assert [c["outcome"] for c in cases] == ["passed", "failed", "skipped"]
    assert cases[1]["message"] == "AssertionError: moved nothing"
    parts = parse_parts("install=0:10 tests=124:150 bench=0:90")
    bench = _bench([STEP, {"tokens": 32768, "skipped": "OOM"}])
    (tmp_path / "tests.log").write_text("collecting\n\nE   ImportError: no deepspeed\n")
    text = render(parts, bench, cases, {"tests": log_tail(tmp_path / "tests.log", n=2)})
    assert "tests.log ends:\n\n```\ncollecting\nE   ImportError: no deepspeed\n```" in text
    assert "| tests | timed out | 150 |" in text
    assert "| tests.a::test_bad | failed | AssertionError: moved nothing |" in text
    assert "| dense (357M) | 8192 | 500 | 50 | 200 | 200 | 50 | 16,384 | 0.310 | 20.00 |" in text
    assert "| dense (357M) | 32768 | OOM |" in text
    assert "| dense (357M) | 8192 | 30.00 | 1.00 | 0.50 |" in text
    assert "| dense | FusedAdam | float32 -> bfloat16 | no |" in text
    assert "790 TFLOP/s" in text
    assert not ok(parts, bench, cases)


def test_verdict_needs_every_part_test_and_length() -> None:
    good_parts = parse_parts("install=0:10 tests=0:50 bench=0:90")
    passed = [{"test": "t", "outcome": "passed", "message": ""}]
    full = _bench([STEP, {**STEP, "tokens": 32768}])
    assert ok(good_parts, full, passed)
    assert not ok(good_parts, _bench([STEP]), passed)  # a length never measured
    assert not ok(good_parts, full, [{"test": "t", "outcome": "error", "message": "x"}])
    assert not ok(parse_parts("install=1:0"), full, passed)
    assert not ok(good_parts, {}, passed)  # the bench wrote nothing


def test_bf16_rounded_values_tell_a_bf16_head_from_a_float32_one() -> None:
    from sao.trainer.learn.models import ValueModel

    class Engine(torch.nn.Module):  # what the check reads of a DeepSpeed engine: .module and the forward
        def __init__(self, module: torch.nn.Module) -> None:
            super().__init__()
            self.module = module

        def forward(self, *a: Any) -> Any:
            return self.module(*a)

    class Bf16Head(ValueModel):  # the head as it ran before issue 23: in its (DeepSpeed-cast) storage dtype
        def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any = None) -> Any:
            h = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            return self.value_head(h.to(self.value_head.weight.dtype)).squeeze(-1).float()

    backbone = build_tiny_model("llama", vocab_size=512).model
    cpu = torch.device("cpu")
    assert not values_bf16_rounded(Engine(ValueModel(backbone, 64).to(torch.bfloat16)), cpu)
    assert values_bf16_rounded(Engine(Bf16Head(backbone, 64).to(torch.bfloat16)), cpu)
