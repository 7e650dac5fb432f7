"""Per-token records (pure parts): the row sample, the band mask characters, the lines, and a resume's cut."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from sao.agent.records import Segment, Trajectory
from sao.trainer.learn.token_records import RowTokens, TokenProbe, _mask, drop_records_after, token_record


def test_the_sample_is_bounded_seeded_and_spans_micro_batches() -> None:
    rows = [[0, 2], [1, 3], []]
    picks = TokenProbe.sample(rows, 3, random.Random(0))
    assert picks is not None and len(picks.picks) == 3
    assert all(rows[i][j] == row for i, j, row in picks.picks)
    again = TokenProbe.sample(rows, 3, random.Random(0))
    assert again is not None and again.picks == picks.picks
    whole = TokenProbe.sample(rows, 10, random.Random(0))
    assert whole is not None and sorted(r for _, _, r in whole.picks) == [0, 1, 2, 3]
    assert TokenProbe.sample(rows, 0, random.Random(0)) is None


def test_mask_characters_follow_the_loss_band_bounds_included() -> None:
    # band (1 - 0.5, 1 + 1.0): log(0.5) and log(2) exactly are on the bounds, hence masked, as the loss masks them
    diff = torch.tensor([0.0, float(torch.log(torch.tensor(0.5))), float(torch.log1p(torch.tensor(1.0))), 5.0,
                         -5.0, float("nan")])  # fmt: skip
    assert _mask(diff, (0.5, 1.0)) == "klhhlx"


def test_a_record_line_names_the_step_episode_and_turns() -> None:
    traj = Trajectory("t", "e", (Segment("prompt", [1, 2]), Segment("action", [3], [-0.5], 7)), 1.0)
    r = RowTokens(0, True, (0.5, 2.0), [-0.5], [-0.4], [1.1052], "k", [0.3], [0.7])
    rec = token_record(4, 6, "dis", "uid-1", traj, r)
    assert (rec["step"], rec["uid"], rec["version"], rec["ratio"], rec["mask"]) == (4, "uid-1", 6, [1.1052], "k")
    assert rec["turns"] == [{"kind": "prompt", "tokens": 2, "version": None}, {"kind": "action", "tokens": 1,
                                                                               "version": 7}]  # fmt: skip
    json.dumps(rec, allow_nan=False)  # what the page parses: no NaN


def test_a_resume_drops_the_lost_branch_records(tmp_path: Path) -> None:
    p = tmp_path / "token_records.jsonl"
    p.write_text("".join(json.dumps({"step": s, "uid": f"u{s}"}) + "\n" for s in (1, 2, 3)) + '{"step": 4, "ui')
    drop_records_after(p, 2)
    assert [json.loads(x)["step"] for x in p.read_text().splitlines()] == [1, 2]
    drop_records_after(tmp_path / "missing.jsonl", 2)  # a run without records: nothing to do
