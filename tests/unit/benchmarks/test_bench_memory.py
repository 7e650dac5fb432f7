"""`sao bench memory` at smoke size: the chunked actor step peaks far below the naive one and computes the same step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sao.benchmarks.bench_memory import MemoryBenchConfig, run


def test_chunked_step_peaks_below_a_quarter_of_naive_with_the_same_result(tmp_path: Path) -> None:
    # tiny:llama keeps SmolLM2's 49k vocabulary: at T = 512 the naive logits alone are ~100 MB each.
    cfg = MemoryBenchConfig(
        out=tmp_path, model="tiny:llama", seq_len=512, chunk_tokens=64, variants=("naive", "chunked"), threads=1
    )
    lines: list[str] = []
    res = run(cfg, echo=lines.append, png=False)
    naive, chunked = res["variants"]["naive"], res["variants"]["chunked"]
    logits_bytes = 511 * 49152 * 4
    assert naive["peak_extra_bytes"] > 2 * logits_bytes  # the naive step does hold vocabulary-sized tensors
    assert chunked["peak_extra_bytes"] < logits_bytes  # not even one [T, V] float32 tensor at once
    assert res["ratio_chunked_to_naive"] <= 0.25
    assert res["logp_mean_abs_diff"] < 1e-5 and res["head_grad_norm_rel_diff"] < 1e-4
    assert json.loads((tmp_path / "memory.json").read_text())["ratio_chunked_to_naive"] == res["ratio_chunked_to_naive"]
    assert any("chunked / naive peak" in line for line in lines)


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown variant"):
        run(MemoryBenchConfig(out=tmp_path, variants=("fused",)))
    with pytest.raises(ValueError, match="seq_len must be >= 2"):
        run(MemoryBenchConfig(out=tmp_path, seq_len=1))
