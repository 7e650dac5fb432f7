"""`sao bench curve`'s failure kinds of Python-tool episodes and its refusal of a run without exported policies."""

from __future__ import annotations

from pathlib import Path

import pytest

from sao.agent.records import Segment, Trajectory
from sao.benchmarks.bench_curve import failure_kind, kind_counts, policies
from sao.trainer.config import ConfigError

TEXT = {
    1: "Compute 12 * 34.",
    2: "```python\nprint(12 * 34)\n```",
    3: "408",
    4: "399",
    5: "The answer is \\boxed{408}.",
    6: "The answer is \\boxed{400}.",
    7: "I think it is big.",
}


def decode(ids: list[int]) -> str:
    return " ".join(TEXT[i] for i in ids)


def episode(
    *turns: tuple[int, int | None], solved: bool = False, prediction: str = "", status: str = "ok"
) -> Trajectory:
    segs = [Segment("prompt", (1,))]
    for action, obs in turns:
        segs.append(Segment("action", (action,), (0.0,), 0))
        if obs is not None:
            segs.append(Segment("observation", (obs,)))
    report = {"gold": "408", "prediction": prediction} if prediction or solved else {}
    info = {"solved": solved, "report": report}
    return Trajectory("t", "sao/PythonTool-v0", tuple(segs), float(solved), status, info)  # type: ignore[arg-type]


def test_each_failure_kind_is_told_apart() -> None:
    assert failure_kind(episode((2, 3), (5, None), solved=True, prediction="408"), decode) == "solved"
    assert failure_kind(episode((7, None)), decode) == "format"
    assert failure_kind(episode((6, None), prediction="400"), decode) == "head_arithmetic"
    assert failure_kind(episode((2, 3), (6, None), prediction="400"), decode) == "copy_error"
    assert failure_kind(episode((2, 4), (6, None), prediction="400"), decode) == "wrong_expression"
    assert failure_kind(episode((2, 3), (7, None), status="truncated"), decode, gold="408") == "no_answer"
    assert failure_kind(episode((2, 4), (7, None), status="truncated"), decode, gold="408") == "wrong_expression"
    assert failure_kind(episode((7, None), status="infra_error"), decode) == "infra_error"


def test_counts_cover_every_kind() -> None:
    counts = kind_counts([episode((7, None)), episode((6, None), prediction="400")], decode)
    assert counts["format"] == 1 and counts["head_arithmetic"] == 1 and sum(counts.values()) == 2


def test_a_run_without_exported_policies_is_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"run\.export_every=1"):
        policies(tmp_path)
    (tmp_path / "policies" / "step_0002").mkdir(parents=True)
    (tmp_path / "policies" / "step_0010").mkdir()
    assert [s for s, _ in policies(tmp_path)] == [2, 10]


def test_the_sft_eval_is_the_runs_eval_before_rl_or_the_one_given(tmp_path: Path) -> None:
    from sao.benchmarks.bench_curve import sft_eval_dir

    job = tmp_path / "job"
    for stage in ("01_sft", "02_eval", "03_pretrain_value", "04_train", "05_eval"):
        (job / stage).mkdir(parents=True)
    assert sft_eval_dir(job) == job / "02_eval"
    arm = tmp_path / "arm"  # a confirm arm: value pretraining, RL and its eval, from the shared SFT checkpoint
    for stage in ("00_pretrain_value", "01_train", "02_eval"):
        (arm / stage).mkdir(parents=True)
    with pytest.raises(ConfigError, match="--sft-eval"):
        sft_eval_dir(arm)
    with pytest.raises(ConfigError, match="no finished eval stage"):
        sft_eval_dir(arm, job / "02_eval")
    (job / "02_eval" / "done.json").write_text("{}")
    assert sft_eval_dir(arm, job / "02_eval") == job / "02_eval"


def test_an_sft_eval_on_other_held_out_tasks_is_refused_before_any_policy_is_evaluated(tmp_path: Path) -> None:
    import json

    from sao.benchmarks.bench_curve import curve
    from sao.trainer.config import config_from_dict, save_config

    arm = tmp_path / "arm"
    (arm / "01_train" / "policies" / "step_0001").mkdir(parents=True)
    (arm / "02_eval").mkdir()
    save_config(config_from_dict({}, ["env.tasks=arithmetic", "eval.n=4"]), arm / "config.yaml")
    other = tmp_path / "other_eval"  # an eval of tasks drawn with another eval.seed
    other.mkdir()
    (other / "done.json").write_text(json.dumps({"solved_by_task": {"not-a-held-out-task": 1}}))
    with pytest.raises(ConfigError, match="none of the run's 4 held-out tasks"):
        curve(arm, 4, tmp_path / "out", other)
