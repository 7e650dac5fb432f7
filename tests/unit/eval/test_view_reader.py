"""`sao view`'s reader: the byte-offset index of growing JSONL files, the episode table over a ledger, the filters."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from sao.eval.view.episodes import EpisodeTable, Query, select
from sao.eval.view.index import LineIndex
from sao.eval.view.reader import Run, Source, tokenizer_source


def _append(path: Path, *recs: Any, raw: str = "") -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in recs) + raw)


def test_index_reads_only_appended_lines_and_waits_for_a_torn_tail(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    idx = LineIndex(p)
    assert idx.refresh().lines == []  # not written yet
    _append(p, {"n": 0}, {"n": 1}, raw='{"n": 2')  # the third line is torn: a writer mid-append
    r = idx.refresh()
    assert [(n, rec["n"]) for n, _, rec in r.lines] == [(0, 0), (1, 1)]
    assert idx.refresh().lines == []  # nothing new
    _append(p, raw='}\n{"n": 3}\nnot json\n')
    r = idx.refresh()
    assert [rec["n"] for _, _, rec in r.lines] == [2, 3] and r.bad == 1 and not r.reset
    assert [idx.line(i)["n"] for i in range(len(idx))] == [0, 1, 2, 3]  # read back by offset


def test_index_starts_over_when_the_file_is_replaced_or_cut(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    _append(p, {"step": 1}, {"step": 2})
    idx = LineIndex(p)
    assert len(idx.refresh().lines) == 2
    tmp = tmp_path / "m.tmp"  # an atomic rewrite (a resumed run's metrics.jsonl): a new inode
    tmp.write_text(json.dumps({"step": 1}) + "\n")
    os.replace(tmp, p)
    r = idx.refresh()
    assert r.reset and [rec["step"] for _, _, rec in r.lines] == [1]
    with open(p, "r+") as f:  # cut in place, shorter than what was indexed
        f.truncate(0)
    r = idx.refresh()
    assert r.reset and r.lines == [] and len(idx) == 0


def test_index_of_100k_lines_is_incremental(tmp_path: Path) -> None:
    p = tmp_path / "big.jsonl"
    p.write_text("".join(json.dumps({"i": i, "pad": "x" * 200}) + "\n" for i in range(100_000)))
    idx = LineIndex(p)
    t0 = time.perf_counter()
    assert len(idx.refresh().lines) == 100_000
    first = time.perf_counter() - t0
    _append(p, {"i": 100_000})
    t0 = time.perf_counter()
    assert [rec["i"] for _, _, rec in idx.refresh().lines] == [100_000]
    assert time.perf_counter() - t0 < max(first / 20, 0.05), "a refresh must read only the appended bytes"
    assert idx.line(99_999)["i"] == 99_999


def _traj(task: str, reward: float, status: str = "ok", version: int = 0, **info: Any) -> dict[str, Any]:
    segs = [
        {"kind": "prompt", "token_ids": [1, 2, 3]},
        {"kind": "action", "token_ids": [4, 5], "logprobs": [-0.1, -0.2], "policy_version": version},
        {"kind": "observation", "token_ids": [6]},
        {"kind": "action", "token_ids": [7], "logprobs": [-0.3], "policy_version": version + 1},
    ]
    return {"task_id": task, "env_id": "sao/Test-v0", "segments": segs, "reward": reward, "status": status,
            "info": info}  # fmt: skip


def _ledger(tmp_path: Path) -> Path:
    p = tmp_path / "trajectories.jsonl"
    rows = [
        {"type": "trajectory", "uid": "a", "seq": 0, "task_index": 0, "status": "ok", "arrived_version": 1,
         "trajectory": _traj("t0", 1.0, version=0, solved=True)},
        {"type": "trajectory", "uid": "b", "seq": 1, "task_index": 1, "status": "truncated", "arrived_version": 1,
         "episode": "a", "trajectory": _traj("t1", 0.0, "truncated", version=1, graded=True)},
        {"type": "trajectory", "uid": "c", "seq": 2, "task_index": 2, "status": "infra_error", "arrived_version": 1,
         "trajectory": _traj("t2", 0.0, "infra_error")},
        {"type": "event", "uid": "a", "event": "trained", "step": 1, "version": 1},
        {"type": "event", "uid": "b", "event": "trained", "step": 2, "version": 2},
        {"type": "resume", "from_step": 1},  # step 2 was lost with its branch: b is pending again
    ]  # fmt: skip
    _append(p, *rows)
    return p


def test_ledger_fates_steps_lags_and_endings(tmp_path: Path) -> None:
    table = EpisodeTable()
    for n, _, rec in LineIndex(_ledger(tmp_path)).refresh().lines:
        table.add(n, rec)
    a, b, c = table.episodes
    assert (a.fate, a.step, a.lag, a.ending, a.solved) == ("trained", 1, 1, "ok", True)
    assert (b.fate, b.step, b.ending) == ("pending", None, "graded_cut"), "a resume voids the lost branch's events"
    assert (c.fate, c.ending) == ("", "infra_error"), "infra errors are never trained"
    assert (a.turns, a.tokens, a.action_tokens, a.oldest_version, a.newest_version) == (2, 7, 3, 0, 1)
    assert (a.episode, b.episode) == ("a", "a"), "b is the second row of a's episode (a prefix break)"


def test_filters_sort_and_bad_input(tmp_path: Path) -> None:
    table = EpisodeTable()
    for i, (task, reward, status) in enumerate([("x1", 0.5, "ok"), ("y2", 1.0, "truncated"), ("x3", 0.0, "ok")]):
        table.add(i, _traj(task, reward, status))
    eps = table.episodes
    assert [e.task_id for e in select(eps, Query(ending="ok"))] == ["x1", "x3"]
    assert [e.task_id for e in select(eps, Query(task="X", sort="reward", desc=True))] == ["x1", "x3"]
    assert [e.task_id for e in select(eps, Query(reward_min=0.4, reward_max=0.9))] == ["x1"]
    assert select(eps, Query(step="1-3")) == [], "plain eval episodes were trained at no step"
    assert [e.task_id for e in select(eps, Query(recorded=True), lambda e: e.task_id == "y2")] == ["y2"]
    with pytest.raises(ValueError, match="step filter 'two'"):
        select(eps, Query(step="two"))
    with pytest.raises(ValueError, match="sort 'size'"):
        select(eps, Query(sort="size"))


def test_a_source_pages_searches_and_joins_token_records(tmp_path: Path) -> None:
    _ledger(tmp_path)
    rec = {"step": 1, "uid": "a", "task_id": "t0", "row": 0, "advantage": [0.5, 0.5, 0.5]}
    _append(tmp_path / "token_records.jsonl", rec)
    s = Source(tmp_path, tmp_path)
    s.refresh()
    page = s.page(Query(limit=2))
    assert page["total"] == 3 and [e["task_id"] for e in page["items"]] == ["t0", "t1"] and page["next"] == 2
    assert page["items"][0]["recorded"] and not page["items"][1]["recorded"]
    hits = s.page(Query(), search="<6>", decode=lambda ids: [f"<{i}>" for i in ids])
    assert [e["task_id"] for e in hits["items"]] == ["t0", "t1", "t2"] and hits["searched"] == 3
    ep = s.episode(0, None)
    assert [g["kind"] for g in ep["segments"]] == ["prompt", "action", "observation", "action"]
    assert ep["token_records"] == [rec] and ep["summary"]["uid"] == "a"
    assert s.page(Query(step="3"))["total"] == 0
    _append(tmp_path / "trajectories.jsonl", {"type": "event", "uid": "b", "event": "trained", "step": 3, "version": 3})
    s.refresh()  # a live run: the new event is folded in, and the kept selection is made again
    assert s.table.episodes[1].step == 3 and s.page(Query(step="3"))["total"] == 1
    with pytest.raises(KeyError):
        s.episode(99, None)


def test_run_finds_stage_folders_and_its_tokenizer(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("model: {path: 'tiny:llama'}\n")
    for stage in ("00_collect", "01_train"):
        (tmp_path / stage).mkdir()
        _append(tmp_path / stage / "trajectories.jsonl", _traj("t", 1.0))
    (tmp_path / "01_train" / "done.json").write_text('{"stage": "train"}')
    (tmp_path / "checkpoints").mkdir()  # no episodes: not a source
    run = Run(tmp_path)
    d = run.describe()
    assert [s["name"] for s in d["sources"]] == ["00_collect", "01_train"]
    assert d["sources"][1]["done"] == {"stage": "train"} and d["model"] == "smollm2"
    eval_dir = tmp_path / "ev"
    eval_dir.mkdir()
    (eval_dir / "report.json").write_text('{"model": "local:/models/x"}')
    assert tokenizer_source(eval_dir) == "/models/x"
    with pytest.raises(ValueError, match="not a folder"):
        Run(tmp_path / "missing")


def test_two_sources_compared_task_by_task_and_two_runs_side_by_side(tmp_path: Path) -> None:
    a, b = tmp_path / "before", tmp_path / "after"
    for folder, solved in ((a, {"t1": 0, "t2": 1, "t3": 0, "t4": 1}), (b, {"t1": 1, "t2": 1, "t3": 0, "t5": 1})):
        folder.mkdir()
        _append(folder / "trajectories.jsonl", *(_traj(t, float(s), solved=bool(s)) for t, s in solved.items()))
    _append(b / "trajectories.jsonl", _traj("t3", 0.0, "infra_error"))  # an infra error is no outcome
    run = Run(a, b)
    assert [s["name"] for s in run.describe()["sources"]] == ["before/.", "after/."]
    c = run.compare("before/.", "after/.")
    assert (c["n"], c["solved_a"], c["solved_b"], c["gained"], c["lost"]) == (3, 1, 2, ["t1"], [])
    assert c["mean"] == pytest.approx(1 / 3) and (c["only_a"], c["only_b"]) == (1, 1)
    with pytest.raises(KeyError, match="no source 'x'"):
        run.compare("x", "after/.")
