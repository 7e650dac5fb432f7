"""Smoke run of `sao bench throughput` with the real trainer (tiny model, TokenGame behind the latency env): the
learner's phase timers and the CPU sampler inside each variant's process report what the docs' tables show."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]


def test_throughput_bench_smoke_times_the_learner_phases_and_the_cpu(
    tmp_path: Path, deepspeed_env: dict[str, str]
) -> None:
    from sao.benchmarks.bench_throughput import ThroughputConfig, run

    doc = run(
        ThroughputConfig(
            out=tmp_path,
            config=ROOT / "configs/bench/throughput.yaml",
            variants=("sync_grpo", "sao"),
            steps=3,
            scale=0.25,
            latency_median_s=0.005,
            latency_sigma=0.5,
            warmup_steps=1,
        ),
        echo=lambda _: None,
    )
    res = doc["results"]
    sao, grpo = res["sao"]["summary"], res["sync_grpo"]["summary"]
    # SAO: a critic (values forward + K steps), no old-policy recompute; sync GRPO: the recompute, no critic
    assert sao["time_values_s"] > 0 and sao["time_critic_s"] > 0 and sao["time_old_logp_s"] == 0
    assert grpo["time_old_logp_s"] > 0 and grpo["time_critic_s"] == 0 and grpo["time_values_s"] == 0
    for s in (sao, grpo):
        parts = s["time_actor_s"] + s["time_critic_s"] + s["time_values_s"]
        assert 0 < parts <= s["time_learner_s"] * 1.001 and s["time_learner_s"] <= s["step_s_mean"]
    for r in res.values():
        c = r["cores"]
        assert c["window_s"] > 0 and 0 < c["trainer"] <= r["cpu_count"] + 0.5
        assert c["vllm"] == 0 and c["sandboxes"] == 0  # in-process engine, no Docker in this env
        assert c["machine"] >= 0.5 * c["trainer"]  # the machine's count includes the trainer (sampling jitter aside)
        assert r["summary"]["trainer_cpu_s_per_traj"] > 0
    assert set(doc["goal"]["variants"]) == {"sao"}
    assert (tmp_path / "throughput.png").stat().st_size > 0
    assert json.loads((tmp_path / "runs" / "sao.cpu.json").read_text())[0]["trainer"] >= 0
