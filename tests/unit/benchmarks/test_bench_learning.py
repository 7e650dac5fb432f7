"""Small pieces of `sao bench learning`: curve smoothing, thresholds, the seed summary, per-run configs, bad input."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.bench_learning import (
    LearningConfig,
    first_reach,
    run,
    run_config,
    run_curves,
    smoothed,
    summarize_runs,
)
from benchmarks.rl_bench_common import deep_update, load_yaml, mean_std

ROOT = Path(__file__).resolve().parents[3]


def test_smoothing_and_first_reach() -> None:
    assert smoothed([0.0, 1.0, 0.5, 1.0], 2) == [0.0, 0.5, 0.75, 0.75]
    assert first_reach([0.1, 0.4, 0.6, 0.9], 0.5) == 2
    assert first_reach([0.1, 0.2], 0.5) is None


def test_curves_and_summary_over_seeds() -> None:
    rows = [
        {"step": i + 1, "success_rate": s, "reward_mean": s, "step_s": 2.0, "explained_variance": ev}
        for i, (s, ev) in enumerate([(0.0, None), (0.2, 0.1), (0.8, 0.3), (1.0, 0.5), (1.0, 0.7)])
    ]
    c = run_curves(rows)
    assert c["time_s"] == [2.0, 4.0, 6.0, 8.0, 10.0]
    assert math.isnan(c["explained_variance"][0]) and c["explained_variance"][-1] == 0.7
    flat = run_curves([{**r, "success_rate": 0.0} for r in rows])
    s = summarize_runs([c, flat], threshold=0.5, smooth=1, final_frac=0.4)
    assert s["final_success_per_seed"] == [1.0, 0.0]
    assert (s["final_success_mean"], s["final_success_std"]) == pytest.approx(mean_std([1.0, 0.0]))
    assert s["reached"] == 1 and s["steps_to_threshold_mean"] == 3.0 and s["seconds_to_threshold_mean"] == 6.0
    assert s["final_explained_variance_mean"] == pytest.approx(0.6)


def test_every_shipped_run_config_is_a_valid_trainer_config(tmp_path: Path) -> None:
    from trainer.config import config_from_dict

    spec = load_yaml(ROOT / "configs/bench/learning.yaml")
    assert set(spec["variants"]) == {"sao", "grpo", "grpo_dis", "running_mean", "sao_k1", "sao_full_critic"}
    schedules = set()
    for env in spec["envs"]:
        for variant in spec["variants"]:
            cfg = config_from_dict(run_config(spec, env, variant, 1, 5, tmp_path, 64))
            assert cfg.run.seed == 1 and cfg.run.total_steps == 5 and cfg.model.tokenizer == str(tmp_path)
            if cfg.env.id == "sao/OnlineWriting-v0":
                schedules.add(cfg.env.kwargs["schedule"])
    assert len(schedules) == len(spec["variants"])  # no two runs share the shifting judge's episode counter
    k1 = config_from_dict(run_config(spec, "token_game", "sao_k1", 0, 5, tmp_path, 64))
    full = config_from_dict(run_config(spec, "token_game", "sao_full_critic", 0, 5, tmp_path, 64))
    assert k1.trainer.critic_updates_per_step == 1 and not full.critic.freeze_attention


def test_grpo_batch_is_rounded_to_whole_groups(tmp_path: Path) -> None:
    spec = deep_update(load_yaml(ROOT / "configs/bench/learning.yaml"), {"base": {"trainer": {"batch_size": 10}}})
    cfg = run_config(spec, "token_game", "grpo", 0, 5, tmp_path, 64)
    assert cfg["trainer"]["batch_size"] == 8


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"variants": ("sao", "nope")}, "unknown variant"),
        ({"envs": ("chess",)}, "unknown env"),
        ({"seeds": ()}, "seed"),
    ],
)
def test_bad_selection_is_refused_before_any_run(tmp_path: Path, kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        run(LearningConfig(out=tmp_path / "out", config=ROOT / "configs/bench/learning.yaml", **kw))  # type: ignore[arg-type]
    assert not (tmp_path / "out" / "runs").exists()


def test_missing_config_file_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="configs/bench"):
        run(LearningConfig(out=tmp_path, config=tmp_path / "missing.yaml"))
