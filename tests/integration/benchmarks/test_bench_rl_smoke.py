"""Smoke runs of `sao bench learning` and `sao bench stability` with the real trainer (the stability bench with its
warm start by `sao sft` on oracle demonstrations), a few RL steps per variant, one seed; the outputs the docs
show must exist."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]


def test_learning_bench_smoke(tmp_path: Path, deepspeed_env: dict[str, str]) -> None:
    from benchmarks.bench_learning import LearningConfig, run

    doc = run(
        LearningConfig(
            out=tmp_path,
            config=ROOT / "configs/bench/learning.yaml",
            tasks=("latency",),
            variants=("sao", "sao_nocorr"),
            seeds=(0,),
            steps=3,
        ),
        echo=lambda _: None,
    )
    res = doc["tasks"]["latency"]["variants"]
    assert set(res) == {"sao", "sao_nocorr"}
    for r in res.values():
        c = r["curves"][0]
        assert c["step"] == [1.0, 2.0, 3.0] and all(0.0 <= s <= 1.0 for s in c["success"])
        assert r["uses_critic"] and len(c["critic_grad_norm"]) == 3
        assert r["config"]["model"]["path"] == "tiny:llama" and r["config"]["run"]["seed"] == 0
    assert (tmp_path / "success_vs_step.png").stat().st_size > 0 and (tmp_path / "dynamics.png").exists()
    assert json.loads((tmp_path / "learning.json").read_text())["tasks"]["latency"]["claim"]


def test_stability_bench_smoke_and_report_only(tmp_path: Path, deepspeed_env: dict[str, str]) -> None:
    from benchmarks.bench_stability import StabilityConfig, run

    ov = {"warm_start": {"steps": 3, "episodes": 16}, "rollout": {"concurrency": 8, "buffer_size": 8}}
    sc = StabilityConfig(
        out=tmp_path,
        config=ROOT / "configs/bench/stability.yaml",
        variants=("sao", "grpo_async"),
        seeds=(0,),
        steps=4,
        window=2,
        overrides=ov,
    )
    doc = run(sc, echo=lambda _: None)
    assert set(doc["runs"]) == {"sao_seed0", "grpo_async_seed0"}
    for r in doc["runs"].values():
        assert r["summary"]["steps"] == 4 and len(r["curves"]["entropy"]) == 4
    assert (tmp_path / "stability.png").stat().st_size > 0
    lines: list[str] = []
    again = run(StabilityConfig(**{**sc.__dict__, "report_only": False}), echo=lines.append)  # finished: not redone
    assert sum("already finished" in x for x in lines) == 2 and set(again["runs"]) == set(doc["runs"])
