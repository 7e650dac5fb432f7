"""`bash scripts/gpu_check.sh --cpu`: the GPU check's own code path (gpu tests, SAO learner steps of a dense and an
MoE model under real DeepSpeed, memory, report) dry-run on CPU, so the script a GPU machine gets cannot rot."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli_env

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]


def test_cpu_dry_run_measures_both_models_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**cli_env(), "OUT": str(out), "PYTHON": sys.executable}
    res = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--cpu"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=500
    )
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(out.glob("*.log")))
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}\n{logs}"
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["ok"]
    assert {p: v["rc"] for p, v in report["parts"].items()} == {"tests": 0, "bench": 0}

    # the gpu tests were collected and skipped for want of a GPU, not broken or deselected
    assert len(report["tests"]) == 4
    assert all(c["outcome"] == "skipped" and "CUDA GPU" in c["message"] for c in report["tests"]), report["tests"]

    bench = report["bench"]
    assert bench["mode"] == "cpu" and bench["matmul"]["tflops"] > 0
    for name in ("dense", "moe"):
        rec = bench["models"][name]
        assert "error" not in rec, rec.get("error")
        assert rec["critic_head_dtype_before"] == "float32"  # load_critic's float32 head, before DeepSpeed
        assert rec["critic_head_dtype"] in ("float32", "bfloat16")  # storage: DeepSpeed's bf16 casts it
        assert rec["critic_values_bf16_rounded"] is False  # ValueModel computes its head in float32 (issue 23)
        assert [s["tokens"] for s in rec["steps"]] == bench["lengths"] == [128, 256]
        for s in rec["steps"]:
            ph = s["phases_s"]
            assert min(ph["values"], ph["actor"], ph["critic"]) > 0
            assert sum(ph.values()) == pytest.approx(s["step_s"], rel=1e-6)
            assert s["metrics"]["trained_tokens"] == s["action_tokens"] > 0  # every action token trained (r = 1)
            assert s["metrics"]["critic_skipped_steps"] == 0 and s["mfu"] > 0 and s["tflop"] > 0
        for m in rec["logprob_memory"]:
            assert all(isinstance(m[v], int) for v in ("naive", "chunked", "backbone"))

    table = (out / "gpu_check.md").read_text()
    assert "| moe (" in table and "critic head dtype" in table and table in res.stdout
    # what the device tool brings back: at most 8 files, plain names, no deeper than two folders
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", p.name) for p in files), files
    assert all(len(p.relative_to(out).parts) <= 3 for p in files)
