"""The critic as a predictor on held-out eval episodes: the value read at the first action token, the calibration by
level, its table and plot, and a real (tiny) critic probed from an eval stage's trajectories."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from sao.agent.records import Segment, Trajectory
from sao.trainer.runs.critic_probe import (
    calibrate,
    calibration_by_level,
    calibration_table,
    first_action_values,
    plot_calibration,
)


def _episode(task: str, prompt_len: int, level: int | None, solved: bool) -> Trajectory:
    segs = (
        Segment("prompt", tuple(range(3, 3 + prompt_len))),
        Segment("action", (40, 41), (0.0, 0.0), 0, 0.0),
        Segment("observation", (50,)),
        Segment("action", (42,), (0.0,), 0, float(solved)),
    )
    info = {"solved": solved} | ({"level": level} if level is not None else {})
    return Trajectory(task, "sao/PythonTool-v0", segs, float(solved), info=info)


class PositionCritic(torch.nn.Module):
    """Outputs its input position as the value (so the value read is the index of the token it was read at)."""

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor | None = None) -> torch.Tensor:
        return torch.arange(ids.shape[1], dtype=torch.float32).expand(ids.shape[0], -1).clone()


class ConstantCritic(torch.nn.Module):
    def forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor | None = None) -> torch.Tensor:
        return torch.full(ids.shape, 0.3)


def test_the_value_is_read_before_the_first_action_token_of_each_row() -> None:
    # prompts of different lengths in one padded batch: the state before the first action token is the head's output
    # at the prompt's last token (index prompt_len - 1), whatever the row's padding
    trajs = [_episode("a", 5, 1, True), _episode("b", 2, 1, False), _episode("c", 9, 2, False)]
    values, _ = first_action_values(PositionCritic(), trajs, pad_id=0, batch_size=2)
    assert values == [4.0, 1.0, 8.0]
    # a constant value explains none of the returns (1, 0, 0 on their action tokens)
    assert math.isclose(first_action_values(ConstantCritic(), trajs, 0)[1], 0.0, abs_tol=1e-9)


def test_calibration_by_level_against_the_outcomes() -> None:
    trajs = [
        _episode("a", 2, 1, True),
        _episode("b", 2, 1, True),
        _episode("c", 2, 4, False),
        _episode("d", 2, 4, True),
    ]
    cal = calibration_by_level(trajs, [0.9, 0.7, 0.2, 0.4])
    assert cal["1"] == {"episodes": 2, "mean_value": 0.8, "success": 1.0, "mean_return": 1.0}
    assert cal["4"]["mean_value"] == 0.30000000000000004 and cal["4"]["success"] == 0.5
    # 1 - Var(R - V) / Var(R): errors 0.1, 0.3, -0.2, 0.6 against returns 1, 1, 0, 1
    err = [0.1, 0.3, -0.2, 0.6]
    var_e = sum((e - sum(err) / 4) ** 2 for e in err) / 4
    assert math.isclose(cal["overall"]["first_action_ev"], 1 - var_e / 0.1875)
    assert math.isnan(calibration_by_level(trajs[:1], [0.5])["overall"]["first_action_ev"])  # nothing to explain
    assert set(calibration_by_level([_episode("x", 2, None, False)], [0.1])) == {"all", "overall"}


def test_a_tiny_critic_probed_on_an_eval_stages_episodes(tmp_path: Path) -> None:
    from sao.trainer.config import config_from_dict

    eval_dir = tmp_path / "02_eval"
    eval_dir.mkdir()
    trajs = [_episode(f"t{i}", 3 + i, 1 + i % 2, i % 3 == 0) for i in range(6)]
    (eval_dir / "trajectories.jsonl").write_text("".join(json.dumps(t.to_dict()) + "\n" for t in trajs))
    cfg = config_from_dict({"model": {"path": "tiny:llama"}, "trainer": {"batch_size": 4}})
    cal = calibrate(cfg, {"before": "actor"}, eval_dir)
    probe = cal["critics"]["before"]
    assert cal["episodes_from"] == str(eval_dir) and probe["critic"] == "actor"
    assert probe["by_level"]["1"]["episodes"] == 3 and probe["by_level"]["2"]["success"] == 1 / 3
    assert math.isfinite(probe["explained_variance"]) and math.isfinite(probe["by_level"]["overall"]["first_action_ev"])
    table = calibration_table([cal])
    head = "| critic | episodes of | level 1: V0 / success | level 2: V0 / success | EV (tokens)"
    assert table.splitlines()[0].startswith(head)
    assert table.splitlines()[2].startswith("| before | 02_eval | ")
    assert calibration_table([]) == ""
    assert plot_calibration(tmp_path / "plots" / "c.png", [cal]).stat().st_size > 0
