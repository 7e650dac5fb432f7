"""`sao bench value-fit` at smoke size: two critic clips on the same split, side by side, with JSON and a plot."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sao.agent.records import write_jsonl
from tests.integration.trainer.test_value_pretrain import _marked_trajectories

pytestmark = [pytest.mark.deepspeed]


def test_value_fit_bench_compares_clips_on_one_split(tmp_path: Path, deepspeed_env: dict[str, str]) -> None:
    from sao.benchmarks.bench_value_fit import ValueFitConfig, run

    rollouts = tmp_path / "rollouts.jsonl"
    write_jsonl(rollouts, _marked_trajectories(24))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "run": {"dir": str(tmp_path / "run")},
                "model": {"path": "tiny:llama"},
                "critic": {"lr": 3e-3},
                "trainer": {"batch_size": 6},
                "deepspeed": {"micro_batch_size": 6},
            }
        )
    )
    doc = run(ValueFitConfig(str(cfg), str(rollouts), tmp_path / "out", clips=(0.01, 10.0), epochs=2), echo=print)
    rows = doc["rows"]
    assert [r["clip"] for r in rows] == [0.01, 10.0] and doc["fit"] + doc["held_out"] == 24
    assert all(len(r["curve"]) == 2 and r["curve"][-1]["grad_norm"] > 0.01 for r in rows)
    # a clip far below the gradient norm must change the fit: the clip reached the critic's optimizer
    assert rows[0]["held_out_ev_after"] != rows[1]["held_out_ev_after"]
    assert rows[0]["held_out_ev_before"] == pytest.approx(rows[1]["held_out_ev_before"])  # same fresh critic
    assert (tmp_path / "out" / "value_fit.json").exists() and (tmp_path / "out" / "value_fit.png").stat().st_size > 0


def test_value_fit_bench_pools_rollout_files_and_compares_fit_set_sizes(
    tmp_path: Path, deepspeed_env: dict[str, str]
) -> None:
    from sao.benchmarks.bench_value_fit import ValueFitConfig, run
    from sao.core.config import ConfigError

    trajs = _marked_trajectories(24)
    write_jsonl(tmp_path / "a.jsonl", trajs[:12])
    write_jsonl(tmp_path / "b.jsonl", trajs[12:])
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"run": {"dir": str(tmp_path / "run")}, "model": {"path": "tiny:llama"},
                                   "critic": {"lr": 3e-3}, "trainer": {"batch_size": 6},
                                   "deepspeed": {"micro_batch_size": 6}}))  # fmt: skip
    pooled = f"{tmp_path / 'a.jsonl'},{tmp_path / 'b.jsonl'}"
    vc = ValueFitConfig(str(cfg), pooled, tmp_path / "out", clips=(10.0,), epochs=1, sizes=(6, 12), lams=(1.0, 0.5))
    doc = run(vc, echo=print)
    assert doc["fit"] + doc["held_out"] == 24  # both files, pooled before the split
    rows = doc["rows"]
    grid = [(r["size"], r["lam"], r["fit_trajectories"]) for r in rows]
    assert grid == [(6, 1, 6), (6, 0.5, 6), (12, 1, 12), (12, 0.5, 12)]
    assert all(r["held_out_trajectories"] == doc["held_out"] for r in rows)  # the same held-out tasks for every row
    assert rows[0]["held_out_ev_after"] != rows[2]["held_out_ev_after"]  # more rollouts, another fit
    assert rows[0]["held_out_ev_after"] != rows[1]["held_out_ev_after"]  # another lambda, another fit
    with pytest.raises(ConfigError, match="--sizes 99"):
        run(ValueFitConfig(str(cfg), pooled, tmp_path / "out2", clips=(10.0,), sizes=(99,)), echo=print)


def test_value_fit_held_out_file_keeps_every_rollout_on_the_fit_side_and_refuses_shared_tasks(tmp_path: Path) -> None:
    from sao.benchmarks.bench_value_fit import ValueFitConfig, fit_and_held_out
    from sao.core.config import ConfigError

    trajs = _marked_trajectories(24)
    tasks = sorted({t.task_id for t in trajs})
    held_ids = set(tasks[: len(tasks) // 3])
    write_jsonl(tmp_path / "fit.jsonl", [t for t in trajs if t.task_id not in held_ids])
    write_jsonl(tmp_path / "eval.jsonl", [t for t in trajs if t.task_id in held_ids])
    fit_file = str(tmp_path / "fit.jsonl")
    vc = ValueFitConfig("unused.yaml", fit_file, tmp_path / "out", held_out=str(tmp_path / "eval.jsonl"))
    fit, held = fit_and_held_out(vc, seed=0)
    assert len(fit) + len(held) == 24 and {t.task_id for t in held} == held_ids
    assert not {t.task_id for t in fit} & held_ids
    # without the file the split holds out a share of the rollouts themselves
    fit2, held2 = fit_and_held_out(ValueFitConfig("unused.yaml", fit_file, tmp_path / "o"), seed=0)
    assert len(fit2) + len(held2) == len(fit) and held2
    # a held-out task the fit also holds is refused, with the task named
    leak = [t for t in trajs if t.task_id not in held_ids][:1]
    write_jsonl(tmp_path / "both.jsonl", leak)
    bad = ValueFitConfig("unused.yaml", fit_file, tmp_path / "o", held_out=str(tmp_path / "both.jsonl"))
    with pytest.raises(ConfigError, match=f"1 of its tasks are in --rollouts too \\(e.g. '{leak[0].task_id}'\\)"):
        fit_and_held_out(bad, seed=0)


def test_value_fit_bench_compares_value_positions_by_one_probe(tmp_path: Path, deepspeed_env: dict[str, str]) -> None:
    # `--value-positions token,turn --epochs 0 --probe`: the head fit alone at each set of positions, and the probe
    # (one figure whatever positions a row trained) on the same held-out episodes
    from sao.benchmarks.bench_value_fit import ValueFitConfig, run, table

    write_jsonl(tmp_path / "rollouts.jsonl", _marked_trajectories(24))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"run": {"dir": str(tmp_path / "run")}, "model": {"path": "tiny:llama"},
                                   "trainer": {"batch_size": 6}, "deepspeed": {"micro_batch_size": 6}}))  # fmt: skip
    vc = ValueFitConfig(str(cfg), str(tmp_path / "rollouts.jsonl"), tmp_path / "out", clips=(10.0,), epochs=0,
                        value_positions=("token", "turn"), probe=True)  # fmt: skip
    doc = run(vc, echo=print)
    rows = doc["rows"]
    assert [r["positions"] for r in rows] == ["token", "turn"] and all(r["curve"] == [] for r in rows)
    assert rows[0]["head_fit"]["cv_mse"] != rows[1]["head_fit"]["cv_mse"]  # fitted on other positions
    probes = [r["probe"] for r in rows]
    assert all(p["by_level"]["overall"]["episodes"] == doc["held_out"] for p in probes)
    assert probes[0]["explained_variance"] != probes[1]["explained_variance"]
    assert "| turn |" in table(doc) and (tmp_path / "out" / "value_fit.png").stat().st_size > 0
