"""`sao bench stability`: the stability criterion on hand-made curves, the shipped config, bad input."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sao.benchmarks.bench_stability import (
    StabilityConfig,
    drop_from_best,
    run,
    run_config,
    run_summary,
    smoothed,
    stability_summary,
)
from sao.core.config import load_yaml

ROOT = Path(__file__).resolve().parents[3]
SPEC = ROOT / "configs/bench/stability.yaml"


def test_drop_from_running_best() -> None:
    assert drop_from_best([0.2, 0.5, 0.4, 0.9, 0.3]) == pytest.approx([0.0, 0.0, 0.1, 0.0, 0.6])
    assert smoothed([1.0, float("nan"), 0.0], 2) == [1.0, 1.0, 0.0]


def test_a_collapse_after_the_plateau_fails_the_criterion() -> None:
    # the toy collapse of the issue: success ~1.0 for a while, then a fall to ~0.25
    success = [0.3] * 10 + [1.0] * 40 + [0.25] * 20
    s = stability_summary(success, window=5, plateau=0.9, max_drop=0.1)
    assert s["plateau_step"] == 15  # the 5-step mean first reaches 0.9 at step 15 (4 of 5 at 1.0: 0.86; 5 of 5: 1)
    assert s["largest_drop_after_plateau"] == pytest.approx(0.75)
    assert s["largest_drop_step"] > 50 and not s["stable"]


def test_a_run_that_holds_its_plateau_passes() -> None:
    success = [0.2] * 10 + [1.0, 0.95] * 30
    s = stability_summary(success, window=4, plateau=0.9, max_drop=0.1)
    assert s["stable"] and s["largest_drop_after_plateau"] <= 0.1 and s["final_success"] > 0.9


def test_a_run_that_never_plateaus_is_not_called_stable() -> None:
    s = stability_summary([0.5] * 30, window=5, plateau=0.9, max_drop=0.1)
    assert s["plateau_step"] is None and not s["stable"] and math.isnan(s["largest_drop_after_plateau"])


def test_run_summary_reads_the_dynamics() -> None:
    rows = [
        {"step": i + 1, "success_rate": 1.0, "entropy": 0.5 - 0.01 * i, "explained_variance": 0.4,
         "mask_frac_low": 0.02, "mask_frac_high": 0.01, "actor_grad_norm": float(i), "policy_lag_mean": 3.0,
         "policy_lag_max": 5, "step_s": 0.5, "dropped_stale": 2}
        for i in range(30)
    ]  # fmt: skip
    s = run_summary(rows, window=5, plateau=0.9, max_drop=0.1)
    assert s["entropy_min"] == pytest.approx(0.21) and s["explained_variance_mean"] == pytest.approx(0.4)
    assert s["actor_grad_norm_max"] == 29.0 and s["policy_lag_max"] == 5 and s["wall_s"] == pytest.approx(15.0)


def test_shipped_config_is_long_lagged_and_valid(tmp_path: Path) -> None:
    from sao.benchmarks.rl_bench_common import register_bench_algorithms
    from sao.trainer.config import config_from_dict

    register_bench_algorithms()
    spec = load_yaml(SPEC)
    assert spec["base"]["run"]["total_steps"] >= 1000 and spec["base"]["trainer"]["max_staleness"] >= 4
    assert {"sao", "sao_no_skip", "grpo_async"} <= set(spec["variants"])
    for variant in spec["variants"]:
        cfg = config_from_dict(run_config(spec, variant, 2, 7, tmp_path, 48))
        assert cfg.run.seed == 2 and cfg.run.total_steps == 7 and cfg.trainer.max_staleness >= 4
    sao = config_from_dict(run_config(spec, "sao", 0, 7, tmp_path, 48)).trainer
    assert sao.critic_updates_per_step == 2 and sao.skip_uniform_reward_batches
    assert not config_from_dict(run_config(spec, "sao_no_skip", 0, 7, tmp_path, 48)).trainer.skip_uniform_reward_batches
    grpo, grpo_skip = (
        config_from_dict(run_config(spec, v, 0, 7, tmp_path, 48)).trainer for v in ("grpo_async", "grpo_async_skip")
    )
    assert grpo.algorithm == grpo_skip.algorithm == "grpo_async" and grpo_skip.skip_uniform_reward_batches
    assert not grpo.skip_uniform_reward_batches


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"variants": ("nope",)}, "unknown variant"), ({"seeds": ()}, "seed"), ({"plateau": 1.5}, "plateau")],
)
def test_bad_input_is_refused_before_any_run(tmp_path: Path, kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        run(StabilityConfig(out=tmp_path / "out", config=SPEC, **kw))  # type: ignore[arg-type]
    assert not (tmp_path / "out" / "runs").exists()


def test_default_variants_and_jobs_are_checked(tmp_path: Path) -> None:
    spec = load_yaml(SPEC)
    assert spec["default_variants"] == ["sao", "grpo_async"] and set(spec["default_variants"]) <= set(spec["variants"])
    with pytest.raises(ValueError, match="--jobs"):
        run(StabilityConfig(out=tmp_path / "out", config=SPEC, jobs=0))
    assert not (tmp_path / "out" / "runs").exists()


def test_pool_map_runs_calls_in_workers_with_progress() -> None:
    import operator
    import time as _time

    from sao.benchmarks.rl_bench_common import map_in_workers as _pool_map

    got: dict[int, object] = {}
    seen: list[set[int]] = []
    _pool_map(operator.pow, [(2, 3), (3, 2), (5, 1)], 2, got.__setitem__)
    assert got == {0: 8, 1: 9, 2: 5}
    _pool_map(_time.sleep, [(1.0,), (1.0,)], 2, got.__setitem__, progress=seen.append, every_s=0.2)
    assert seen and all(s <= {0, 1} for s in seen) and any(s for s in seen)  # progress while both still ran


def test_steps_written_counts_metric_lines(tmp_path: Path) -> None:
    from sao.benchmarks.bench_stability import _steps_written

    assert _steps_written(tmp_path) == 0
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    assert _steps_written(tmp_path) == 2
