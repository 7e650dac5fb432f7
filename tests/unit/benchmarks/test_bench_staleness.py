"""`sao bench staleness`: the real coordinator replaying recorded episodes under `wait` and `drop`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sao.agent.records import Segment, Trajectory
from sao.benchmarks.bench_staleness import Setting, StalenessBenchConfig, length_bias, run


def _ledger(path: Path, n: int = 16) -> Path:
    """A run's ledger of ``n`` episodes whose wall time grows with their length (as SWE episodes' do)."""
    with open(path, "w") as f:
        for i in range(n):
            k = 1 + (i % 8)
            segs = (Segment("prompt", (1,) * 10), Segment("action", (2,) * (100 * k), (-0.5,) * (100 * k), 0, 0.0))
            tr = Trajectory(f"t{i}", "sao/SWE-v0", segs, 0.0, timings={"total_s": 10.0 * k**2})
            f.write(json.dumps({"type": "trajectory", "uid": f"u{i}", "trajectory": tr.to_dict()}) + "\n")
    (path.parent / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "step_s": 120.0}) + "\n" for s in (1, 2)))
    return path


def test_length_bias_counts_drops_by_length_quarter() -> None:
    finished = [100, 200, 300, 400, 500, 600, 700, 800]
    out = length_bias(finished, [100, 200, 300, 400, 500, 600], [700, 800])
    assert out["dropped_share_longest_quarter"] == 1.0 and out["dropped_share_shortest_quarter"] == 0.0
    assert out["mean_tokens_trained"] < out["mean_tokens_finished"]


def test_drop_trains_the_short_episodes_and_wait_trains_them_all(tmp_path: Path) -> None:
    path = _ledger(tmp_path / "trajectories.jsonl")
    cfg = StalenessBenchConfig(out=tmp_path / "out", trajectories=path, settings=(Setting(16, 16, 1),), steps=12,
                               speedup=400.0)  # fmt: skip
    report = run(cfg, echo=lambda _: None)
    rows = {r["policy"]: r for r in report["rows"]}
    assert report["config"]["step_s"] == 120.0  # read from the run's metrics
    wait, drop = rows["wait"], rows["drop"]
    assert wait["dropped"] == 0 and wait["ledger_dropped"] == 0 and wait["trained"] == 48
    assert wait["max_lag"] <= 1 and drop["max_lag"] <= 1
    # with 16 episodes in flight and a bound of 1, the long ones come back too old and only `drop` throws them away
    assert drop["dropped"] > 0 and drop["dropped"] == drop["ledger_dropped"]
    assert drop["dropped_share_longest_quarter"] > drop["dropped_share_shortest_quarter"]
    assert drop["mean_tokens_trained"] < drop["mean_tokens_finished"]
    assert (tmp_path / "out" / "staleness.png").stat().st_size > 0
    assert json.loads((tmp_path / "out" / "staleness.json").read_text())["rows"][0]["policy"] == "wait"


@pytest.mark.parametrize(
    ("text", "match"), [("4:4", "CONCURRENCY:BUFFER:MAX_STALENESS"), ("0:4:1", "must be >= 1"), ("a:b:c", "three")]
)
def test_bad_settings_are_refused(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Setting.parse(text)


def test_a_file_without_wall_times_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "trajectories.jsonl"
    segs = (Segment("prompt", (1,)), Segment("action", (2,), (-0.5,), 0, 0.0))
    path.write_text("\n".join(Trajectory(f"t{i}", "e", segs, 0.0).to_json() for i in range(3)) + "\n")
    with pytest.raises(ValueError, match=r"timings\.total_s"):
        run(StalenessBenchConfig(out=tmp_path / "o", trajectories=path, step_s=1.0), echo=lambda _: None)


def test_the_cli_names_a_missing_ledger_and_a_bad_setting(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from sao.cli.main import app

    res = CliRunner().invoke(app, ["bench", "staleness", str(tmp_path / "nope.jsonl"), "--step-s", "1"])
    assert res.exit_code == 2 and "not found; pass a run's trajectories.jsonl" in _plain(res.output)
    path = _ledger(tmp_path / "trajectories.jsonl")
    res = CliRunner().invoke(app, ["bench", "staleness", str(path), "--settings", "4:4"])
    assert res.exit_code == 2 and "is not CONCURRENCY:BUFFER:MAX_STALENESS" in _plain(res.output)


def _plain(text: str) -> str:
    """The CLI's error box as one line (rich wraps it at the terminal width)."""
    return " ".join(text.replace("│", " ").split())
