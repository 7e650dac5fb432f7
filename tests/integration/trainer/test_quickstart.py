"""`sao train configs/quickstart.yaml` in a tiny form: every stage for real (the solver in Docker, SFT and SAO on
SmolLM2 with DeepSpeed, held-out evals), sized down with overrides: the session fixture ``tiny_quickstart``
(tests/integration/conftest.py), whose run the confirm bench's smoke starts from. The full job is a benchmark
(docs/results.md)."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.integration.conftest import StagedRun

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.deepspeed]


def test_staged_quickstart_runs_every_stage_and_prints_the_table(tiny_quickstart: StagedRun) -> None:
    res = tiny_quickstart
    run = res.run
    assert res.returncode == 0, res.stderr[-4000:]
    stages = sorted(p.name for p in run.iterdir() if p.is_dir() and p.name[:2].isdigit())
    assert stages == ["00_collect", "01_sft", "02_eval", "03_pretrain_value", "04_train", "05_eval"]
    collected = json.loads((run / "00_collect" / "done.json").read_text())
    assert collected["solved"] == collected["episodes"] == 4  # the solver's tool episodes, graded by the env
    first = json.loads((run / "00_collect" / "trajectories.jsonl").read_text().splitlines()[0])
    assert first["status"] == "ok" and [s["kind"] for s in first["segments"]] == [
        "prompt", "action", "observation", "action"
    ]  # fmt: skip
    summary = json.loads((run / "summary.json").read_text())
    assert [e["label"] for e in summary["evals"]] == ["after SFT", "after RL"]
    # eval.samples=2: each of the 2 held-out tasks played twice, one unit each (its solved fraction)
    assert all(e["episodes"] + e["infra_errors"] == 4 for e in summary["evals"])
    played = [json.loads(x) for x in (run / "02_eval" / "trajectories.jsonl").read_text().splitlines()]
    assert len({r["info"]["seed"] for r in played if "info" in r}) == 4  # every episode its own seed
    for e in summary["evals"]:
        assert e["tasks"] == len(e["solved_by_task"]) == 2 and "success_se" in e
        assert all(v in (0, 0.5, 1) for v in e["solved_by_task"].values())
    out = res.stdout + res.stderr  # the table comes through say(), on the terminal stream (stderr)
    assert "| after SFT |" in out and "| after RL |" in out
    assert (run / "plots" / "stages.png").stat().st_size > 0
    # value pretraining ran on the SFT policy's own rollouts and its critic started the RL stage
    pv = json.loads((run / "03_pretrain_value" / "done.json").read_text())
    assert pv["rollouts"] == 4 and pv["held_out_trajectories"] >= 1 and pv["critic_steps"] == 1
    assert "held_out_ev_after" in pv and "value pretraining:" in out
    sft_model = json.loads((run / "01_sft" / "done.json").read_text())["model"]
    pv_traj = [json.loads(x) for x in (run / "03_pretrain_value" / "trajectories.jsonl").read_text().splitlines()]
    assert len(pv_traj) == 4 and all(t["env_id"] == "sao/PythonTool-v0" for t in pv_traj)
    train_cfg = yaml.safe_load((run / "04_train" / "config.yaml").read_text())
    assert train_cfg["critic"]["init"] == pv["critic"] and train_cfg["model"]["path"] == sft_model
    assert len((run / "04_train" / "critic_warmup.jsonl").read_text().splitlines()) == 1
    assert (run / "04_train" / "final" / "actor" / "model.safetensors").exists()
    assert [json.loads(x)["step"] for x in (run / "04_train" / "metrics.jsonl").read_text().splitlines()] == [1]
    assert "uniform-reward batches" in out  # the RL dynamics line under the table
    # eval.critic_probe: the eval after RL reads both critics (where RL's started, where it ended) on its episodes
    probed = summary["evals"][-1]["critic_calibration"]["critics"]
    assert list(probed) == ["after value pretraining", "after RL"]
    assert probed["after value pretraining"]["critic"] == pv["critic"]
    assert all(p["by_level"]["all"]["episodes"] == summary["evals"][-1]["episodes"] for p in probed.values())
    print(f"tiny staged quickstart wall time {res.wall_s:.0f}s")
