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
    """Warm start (a few SFT steps) + 3 RL steps of two variants, in two worker processes (``--jobs 2``)."""
    from sao.benchmarks.bench_learning import LearningConfig, run

    ov = {"families": {"token_game": {"warm_start": {"steps": 5, "episodes": 16}}}}
    lines: list[str] = []
    doc = run(
        LearningConfig(
            out=tmp_path,
            config=ROOT / "configs/bench/learning.yaml",
            tasks=("latency",),
            variants=("sao", "sao_nocorr"),
            seeds=(0,),
            steps=3,
            jobs=2,
            overrides=ov,
        ),
        echo=lines.append,
    )
    res = doc["tasks"]["latency"]["variants"]
    assert set(res) == {"sao", "sao_nocorr"}
    warm = doc["warm_starts"]["token_game/seed0"]
    assert 0.0 <= warm["check"]["p_right"] <= 1.0 and warm["check"]["n"] > 0
    assert any(x.startswith("warm start token_game seed 0: held-out p(right)") for x in lines)
    for r in res.values():
        c = r["curves"][0]
        assert c["step"] == [1.0, 2.0, 3.0] and all(0.0 <= s <= 1.0 for s in c["success"])
        assert r["uses_critic"] and len(c["critic_grad_norm"]) == 3
        assert r["config"]["model"]["path"] == warm["model"] and r["config"]["run"]["seed"] == 0
    assert (tmp_path / "success_vs_step.png").stat().st_size > 0 and (tmp_path / "dynamics.png").exists()
    assert json.loads((tmp_path / "learning.json").read_text())["tasks"]["latency"]["claim"]


def test_stability_bench_smoke_and_report_only(tmp_path: Path, deepspeed_env: dict[str, str]) -> None:
    """The default command's path: the warm start, then both default variants in two worker processes at once."""
    from sao.benchmarks.bench_stability import StabilityConfig, run

    ov = {"warm_start": {"steps": 3, "episodes": 16}, "base": {"rollout": {"concurrency": 8, "buffer_size": 8}}}
    sc = StabilityConfig(
        out=tmp_path, config=ROOT / "configs/bench/stability.yaml", seeds=(0,), steps=4, window=2, jobs=2, overrides=ov
    )
    lines: list[str] = []
    doc = run(sc, echo=lines.append)
    assert set(doc["runs"]) == {"sao_seed0", "grpo_async_seed0"}  # the config's default_variants
    for name, r in doc["runs"].items():
        assert r["summary"]["steps"] == 4 and len(r["curves"]["entropy"]) == 4
        saved = (tmp_path / "runs" / f"{name}.yaml").read_text()
        assert str(tmp_path / "warm" / "seed0" / "final" / "actor") in saved  # RL started from the warm start
        assert (tmp_path / "runs" / f"{name}.log").exists()  # each worker's output goes to its run's log
    assert (tmp_path / "stability.png").stat().st_size > 0
    lines.clear()
    again = run(StabilityConfig(**{**sc.__dict__, "jobs": 1}), echo=lines.append)  # finished: not redone
    assert sum("already finished" in x for x in lines) == 2 and set(again["runs"]) == set(doc["runs"])
