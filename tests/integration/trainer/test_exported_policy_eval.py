"""``eval.exported_policies``: the eval stage after a train stage scores each policy that stage exported
(``run.export_every``), then the final model, on the same held-out tasks: real SmolLM2 policies (the tiny quickstart
run's SFT and RL actors) playing the python tool in Docker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import TINY_QUICKSTART, StagedRun

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.deepspeed]
ROOT = Path(__file__).resolve().parents[3]


def test_eval_stage_scores_each_exported_policy_then_the_final_model(
    tiny_quickstart: StagedRun, tmp_path: Path
) -> None:
    from sao.trainer.config import load_config
    from sao.trainer.runs.stages import eval_stage

    assert tiny_quickstart.returncode == 0, "the tiny quickstart run failed:\n" + tiny_quickstart.stderr[-3000:]
    src = tiny_quickstart.run
    run = tmp_path / "run"
    train = run / "00_train"
    (train / "policies").mkdir(parents=True)
    # a train stage of 2 steps that exported every step: step 1 (here the SFT policy) and step 2, its final model
    (train / "policies" / "step_0001").symlink_to(src / "01_sft" / "final" / "actor")
    (train / "policies" / "step_0002").mkdir()  # the last step's export is the final model: not loaded again
    final = src / "04_train" / "final" / "actor"
    (train / "done.json").write_text(json.dumps({"steps": 2, "model": str(final)}))
    overrides = [*TINY_QUICKSTART, f"run.dir={run}", "run.export_every=1", "eval.exported_policies=true",
                 "eval.critic_probe=false"]  # fmt: skip
    cfg = load_config(ROOT / "configs" / "quickstart.yaml", overrides)
    out = run / "01_eval"
    out.mkdir()
    res = eval_stage(cfg, str(final), out)
    [step1] = res["exported"]
    assert step1["label"] == "after RL step 1" and step1["policy_step"] == 1
    assert step1["model"] == str(train / "policies" / "step_0001") and res["model"] == str(final)
    assert step1["episodes"] + step1["infra_errors"] == 2 and set(step1["solved_by_task"]) == set(res["solved_by_task"])
    assert len((out / "step_0001" / "trajectories.jsonl").read_text().splitlines()) == 2
    assert len((out / "trajectories.jsonl").read_text().splitlines()) == 2
    # after a kill the finished policy eval is kept, not re-run: its policy is gone and the stage still finishes
    (train / "policies" / "step_0001").unlink()
    (train / "policies" / "step_0001").mkdir()
    again = eval_stage(cfg, str(final), out)
    [kept] = again["exported"]
    assert kept == json.loads((out / "step_0001" / "done.json").read_text())
    assert (kept["label"], kept["solved_by_task"], kept["wall_s"]) == (step1["label"], step1["solved_by_task"],
                                                                      step1["wall_s"])  # fmt: skip
