"""The staged run's scoring: success, valid tool-call rate, mean turns, and the paired before/after difference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sao.agent.records import Segment, Trajectory

TOOLS = [{"type": "function", "function": {"name": "python", "description": "", "parameters": {}}}]


def _traj(tok: Any, tid: str, actions: list[str], solved: bool, status: str = "ok") -> Trajectory:
    segs = [Segment("prompt", tok.encode("<|im_start|>user\nCompute 2 * 3.<|im_end|>\n", add_special_tokens=False))]
    for a in actions:
        ids = tok.encode(a + "<|im_end|>", add_special_tokens=False)
        segs.append(Segment("action", ids, tuple([0.0] * len(ids)), 0))
    info = {"solved": solved, "turns": len(actions), "tools": TOOLS}
    return Trajectory(tid, "sao/PythonTool-v0", tuple(segs), float(solved), status, info)  # type: ignore[arg-type]


def test_episode_scores_count_valid_tool_calls_success_and_turns(smollm2_dir: Path) -> None:
    from transformers import AutoTokenizer

    from sao.eval.scores import episode_scores

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(2 * 3)"}}</tool_call>'
    trajs = [
        _traj(tok, "a", [call, "\\boxed{6}"], True),
        _traj(tok, "b", ['<tool_call>{"name": "calculator", "arguments": {}}</tool_call>', "6"], False),  # no such tool
        _traj(tok, "c", ["\\boxed{6}"], True),  # right without the tool
        _traj(tok, "d", ["<tool_call>{not json</tool_call>", "```python\nprint(2 * 3)\n```", "x"], False),
        Trajectory("e", "sao/PythonTool-v0", (), 0.0, "infra_error", {"infra_error": "sandbox died"}),
    ]
    trajs[3].info["truncation_reason"] = "time_limit"  # cut by the env's wall-clock limit
    s = episode_scores(trajs, tok)
    assert s["episodes"] == 4 and s["infra_errors"] == 1
    assert s["success"] == 0.5
    assert s["valid_tool_call_rate"] == 0.5  # a (tool_call) and d (fenced block, the env's other call form)
    assert s["mean_turns"] == pytest.approx((2 + 2 + 1 + 3) / 4)
    assert s["solved_by_task"] == {"a": 1, "b": 0, "c": 1, "d": 0}
    assert s["time_limited"] == 1


def test_episode_scores_count_tokens_truncation_and_edits_of_the_bugs_file() -> None:
    from sao.eval.scores import episode_scores, patched_files, score_table

    class Tok:
        def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
            return "no call"

    def diff(path: str) -> str:
        return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-x\n+y\n"

    def traj(tid: str, patch: str | None, status: str = "ok") -> Trajectory:
        segs = (Segment("prompt", (1, 2, 3, 4)), Segment("action", (5, 6), (0.0, 0.0), 0), Segment("observation", (7,)),
                Segment("action", (8,), (0.0,), 0))  # fmt: skip
        info = {"turns": 2, "report": {"model_patch": patch}}
        return Trajectory(tid, "sao/SWE-v0", segs, 0.0, status, info)  # type: ignore[arg-type]

    tasks = [{"instance_id": i, "patch": diff("pkg/core.py")} for i in "abcd"]
    trajs = [traj("a", diff("pkg/core.py")), traj("b", diff("pkg/other.py")), traj("c", None, "truncated"),
             traj("d", diff("pkg/core.py"), "infra_error")]  # fmt: skip
    s = episode_scores(trajs, Tok(), tasks)
    assert s["episodes"] == 3 and s["truncated"] == 1
    assert s["tokens_per_episode"] == 8 and s["observation_share"] == pytest.approx(1 / 8)
    assert s["edited_bug_file_rate"] == pytest.approx(1 / 3)  # a edited pkg/core.py; b another file; c nothing
    assert patched_files("") == set() and patched_files("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n") == set()  # unreadable
    assert "edited_bug_file_rate" not in episode_scores(trajs, Tok())  # no tasks with a patch: not an SWE eval
    table = score_table([{**s, "label": "after SFT"}])
    assert "edited the bug's file" in table and "| 8 | 0.125 | 1 | 0 | 0.333 |" in table
    assert "solved_by_family" not in s  # tasks without an injected bug's family


def test_episode_scores_count_resolved_by_bug_family() -> None:
    from sao.eval.scores import bug_family, episode_scores

    class Tok:
        def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
            return "no call"

    def traj(tid: str, solved: bool, status: str = "ok") -> Trajectory:
        segs = (Segment("prompt", (1,)), Segment("action", (2,), (0.0,), 0))
        return Trajectory(tid, "sao/SWE-v0", segs, float(solved), status, {"turns": 1, "solved": solved})  # type: ignore[arg-type]

    tasks = [{"instance_id": "a", "sao_mutation": {"operator": "swapped_args"}},
             {"instance_id": "b", "sao_mutation": {"operator": "swapped_args"}},
             {"instance_id": "c", "sao_mutation": {"operator": "comparison_flip"}},
             {"instance_id": "d", "sao_mutation": {"operator": "comparison_flip"}}, {"instance_id": "e"}]  # fmt: skip
    trajs = [traj("a", True), traj("b", False), traj("c", False), traj("d", True, "infra_error"), traj("e", True)]
    s = episode_scores(trajs, Tok(), tasks)
    # an infra error is not an episode of its family; a task with no family is left out of the breakdown
    assert s["solved_by_family"] == {"comparison_flip": [0, 1], "swapped_args": [1, 2]}
    assert bug_family({"sao_mutation": {"operator": "off_by_one"}}) == "off_by_one" and bug_family({}) is None


def test_several_episodes_a_task_make_one_unit_its_solved_fraction_and_the_se_over_tasks() -> None:
    from sao.eval.scores import episode_scores, level_table, paired_difference, score_table

    class Tok:
        def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
            return "no call"

    def traj(tid: str, solved: bool, level: int) -> Trajectory:
        segs = (Segment("prompt", (1, 2)), Segment("action", (3,), (0.0,), 0))
        info = {"solved": solved, "turns": 1, "level": level}
        return Trajectory(tid, "sao/PythonTool-v0", segs, float(solved), "ok", info)  # type: ignore[arg-type]

    # eval.samples = 4: task a 4/4, b 1/4, c 0/4 (+ an infra error, not an episode), d 2/4
    plays = {"a": [1, 1, 1, 1], "b": [0, 1, 0, 0], "c": [0, 0, 0], "d": [1, 0, 0, 1]}
    trajs = [traj(t, bool(x), 1 if t in "ab" else 2) for t, xs in plays.items() for x in xs]
    trajs.append(Trajectory("c", "sao/PythonTool-v0", (), 0.0, "infra_error", {"infra_error": "sandbox died"}))
    s = episode_scores(trajs, Tok())
    assert s["episodes"] == 15 and s["tasks"] == 4 and s["infra_errors"] == 1
    assert s["solved_by_task"] == {"a": 1.0, "b": 0.25, "c": 0.0, "d": 0.5}
    fr = [1.0, 0.25, 0.0, 0.5]
    m = sum(fr) / 4
    assert s["success_se"] == pytest.approx((sum((x - m) ** 2 for x in fr) / 3 / 4) ** 0.5)  # over tasks
    assert s["success"] == pytest.approx(7 / 15)  # over episodes
    assert s["by_level"]["1"]["tasks"] == 2 and s["by_level"]["1"]["success_se"] == pytest.approx(0.375)
    assert f"± {s['success_se']:.3f}" in score_table([{**s, "label": "after RL"}])
    # a paired difference of two such evals is over tasks, of the fractions
    after = {"a": 1.0, "b": 0.75, "c": 0.25, "d": 0.5}
    mean, se, n = paired_difference(s["solved_by_task"], after)
    d = [0.0, 0.5, 0.25, 0.0]
    assert n == 4 and mean == pytest.approx(sum(d) / 4)
    assert se == pytest.approx((sum((x - mean) ** 2 for x in d) / 3 / 4) ** 0.5)
    assert "+0.250 ± 0.250 (n=2)" in level_table([{**s, "label": "SFT"}, {**s, "solved_by_task": after, "label": "RL"}])
    # one episode a task: the binomial SE, as before
    one = episode_scores([traj(t, t in "ab", 1) for t in "abcd"], Tok())
    assert one["solved_by_task"] == {"a": 1, "b": 1, "c": 0, "d": 0}
    assert one["success_se"] == pytest.approx((0.5 * 0.5 / 4) ** 0.5)


def test_paired_difference_uses_the_tasks_both_evals_ran() -> None:
    from sao.eval.scores import paired_difference

    before = {"a": 0, "b": 0, "c": 1, "d": 1, "only_before": 1}
    after = {"a": 1, "b": 0, "c": 1, "d": 1, "only_after": 0}
    mean, se, n = paired_difference(before, after)
    assert n == 4 and mean == pytest.approx(0.25)
    assert se == pytest.approx(0.25)  # d = [1, 0, 0, 0]: sample std 0.5, over sqrt(4)


def test_pooled_paired_difference_averages_seeds_within_a_task_and_takes_the_se_over_tasks() -> None:
    from sao.eval.scores import paired_difference, pooled_paired_difference

    sft = {"a": 0, "b": 0, "c": 1, "d": 0}  # one SFT eval shared by two RL seeds
    seed1 = {"a": 1, "b": 1, "c": 1, "d": 0}
    seed2 = {"a": 1, "b": 0, "c": 0, "d": 0, "extra": 1}
    mean, se, n = pooled_paired_difference([(sft, seed1), (sft, seed2)])
    # per task: a (1 + 1) / 2 = 1, b (1 + 0) / 2 = 0.5, c (0 - 1) / 2 = -0.5, d 0; "extra" is not in every pair
    assert n == 4 and mean == pytest.approx(0.25)
    d = [1.0, 0.5, -0.5, 0.0]
    sd = (sum((x - 0.25) ** 2 for x in d) / 3) ** 0.5
    assert se == pytest.approx(sd / 2)
    assert pooled_paired_difference([(sft, seed1)]) == paired_difference(sft, seed1)
    m, s, k = pooled_paired_difference([])
    assert k == 0 and m != m and s != s  # nan: nothing to pool


def test_held_out_set_is_one_set_for_every_seed_and_never_a_training_task() -> None:
    from sao.trainer.config import load_config
    from sao.trainer.runs.stages import held_out_tasks, training_tasks

    root = Path(__file__).resolve().parents[3]
    sets = []
    for seed in (0, 1, 2):
        cfg = load_config(root / "configs" / "quickstart.yaml", [f"run.seed={seed}"])
        held = held_out_tasks(cfg)
        assert len(held) == cfg.eval.n
        train = {t["problem"] for t in training_tasks(cfg)}
        assert not train & {t["problem"] for t in held}
        sets.append([t["id"] for t in held])
    assert sets[0] == sets[1] == sets[2]
    other = load_config(root / "configs" / "quickstart.yaml", ["eval.seed=7"])
    assert [t["id"] for t in held_out_tasks(other)] != sets[0]


def test_rl_dynamics_averages_the_steps_and_says_which_way_the_turn_advantages_pointed() -> None:
    from sao.trainer.runs.stages import rl_dynamics

    rows = [
        {"uniform_reward_batch": 0.0, "explained_variance": -1.5, "mask_frac_low": 0.1, "mask_frac_high": 0.0,
         "success_rate": 0.5, "adv_pos_turns_solved": 0.25, "adv_neg_turns_failed": 1.0},
        {"uniform_reward_batch": 1.0, "explained_variance": -0.5, "mask_frac_low": 0.0, "mask_frac_high": 0.3,
         "success_rate": 0.0, "adv_neg_turns_failed": 0.5, "skipped_steps": 1.0},
    ]  # fmt: skip
    d = rl_dynamics(rows)
    assert d["uniform_batch_frac"] == 0.5 and d["skipped_step_frac"] == 0.5
    assert (d["first_explained_variance"], d["last_explained_variance"]) == (-1.5, -0.5)
    assert d["dis_masked_frac"] == pytest.approx(0.2) and d["batch_success_mean"] == 0.25
    # a step with no solved episode has no solved-turn share: the mean is over the steps that had one
    assert d["adv_pos_turns_solved"] == 0.25 and d["adv_neg_turns_failed"] == 0.75
