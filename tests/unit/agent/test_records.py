"""Trajectory records: validation, JSONL round-trip, Arrow (datasets) and parquet round-trip."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sao.agent.records import Segment, Trajectory, read_jsonl, write_jsonl
from sao.agent.records_arrow import from_dataset, read_parquet, to_dataset, write_parquet

floats = st.floats(-20, 0, allow_nan=False)


@st.composite
def trajectory(draw: st.DrawFn) -> Trajectory:
    segs: list[Segment] = [Segment("prompt", tuple(draw(st.lists(st.integers(0, 50000), max_size=4))))]
    for _ in range(draw(st.integers(0, 3))):
        ids = draw(st.lists(st.integers(0, 50000), max_size=4))
        segs.append(
            Segment(
                "action",
                tuple(ids),
                logprobs=tuple(draw(st.lists(floats, min_size=len(ids), max_size=len(ids)))),
                policy_version=draw(st.integers(0, 100)),
                reward=draw(st.one_of(st.none(), st.floats(-1, 1))),
            )
        )
        segs.append(Segment("observation", tuple(draw(st.lists(st.integers(0, 50000), max_size=4)))))
    status = draw(st.sampled_from(["ok", "truncated", "infra_error"]))
    return Trajectory(
        task_id=draw(st.text(max_size=8)),
        env_id="sao/test",
        segments=tuple(segs),
        reward=0.0 if status == "infra_error" else draw(st.floats(-1, 1)),  # no outcome: written as null
        status=status,
        info=draw(st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=5)), max_size=3)),
        timings={"total_s": draw(st.floats(0, 100))},
        group_id=draw(st.one_of(st.none(), st.integers(0, 10**6))),
    )


@settings(max_examples=30, deadline=None)
@given(st.lists(trajectory(), min_size=1, max_size=4))
def test_round_trips(tmp_path_factory: pytest.TempPathFactory, trajs: list[Trajectory]) -> None:
    d = tmp_path_factory.mktemp("rt")
    write_jsonl(d / "t.jsonl", trajs)
    assert list(read_jsonl(d / "t.jsonl")) == trajs
    assert from_dataset(to_dataset(trajs)) == trajs
    write_parquet(d / "t.parquet", trajs)
    assert read_parquet(d / "t.parquet") == trajs


def test_segment_validation() -> None:
    with pytest.raises(ValueError, match="kind"):
        Segment("tool", (1,))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="logprobs and policy_version"):
        Segment("action", (1,))
    with pytest.raises(ValueError, match="1 tokens but 2 logprobs"):
        Segment("action", (1,), logprobs=(0.0, 0.0), policy_version=0)
    with pytest.raises(ValueError, match="carries no logprobs"):
        Segment("observation", (1,), logprobs=(0.0,))
    with pytest.raises(ValueError, match="status"):
        Trajectory("t", "e", (), 0.0, status="crashed")  # type: ignore[arg-type]


def test_bad_files_name_the_problem(tmp_path: Path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text('{"task_id": "x"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not a Trajectory"):
        list(read_jsonl(p))
    with pytest.raises(ValueError, match="no trajectory parquet"):
        read_parquet(tmp_path / "missing.parquet")
    import datasets

    with pytest.raises(ValueError, match="lacks trajectory columns"):
        from_dataset(datasets.Dataset.from_list([{"a": 1}]))


def test_records_written_before_group_ids_still_load(tmp_path: Path) -> None:
    import datasets

    t = Trajectory("t", "e", (Segment("prompt", (1,)),), 1.0)
    d = t.to_dict()
    del d["group_id"]
    assert Trajectory.from_dict(d).group_id is None
    rows = to_dataset([t]).remove_columns(["group_id"])
    assert isinstance(rows, datasets.Dataset)
    assert from_dataset(rows) == [t]
    assert Trajectory.from_dict({**d, "group_id": 3}).group_id == 3


def test_an_infra_error_is_written_without_a_reward(tmp_path: Path) -> None:
    """An outcome nobody gave is never written as a reward (issue 44): ``"reward": null`` on disk, and a null
    reward is refused on anything but an infra error."""
    import json

    failed = Trajectory("t", "sao/test", (), 0.0, "infra_error", {"infra_error": "the engine died"})
    write_jsonl(tmp_path / "t.jsonl", [failed])
    assert json.loads((tmp_path / "t.jsonl").read_text())["reward"] is None
    assert list(read_jsonl(tmp_path / "t.jsonl")) == [failed]
    with pytest.raises(ValueError, match="only an infra_error"):
        Trajectory.from_dict({**failed.to_dict(), "status": "ok"})
