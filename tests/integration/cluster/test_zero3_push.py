"""Broadcast weight sync from a 2-rank ZeRO-3 trainer: parameters gathered a layer at a time arrive whole."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests._cli_env import cli_env
from tests.conftest import free_port

pytestmark = [pytest.mark.deepspeed, pytest.mark.timeout(600)]


def test_zero3_push_sends_every_full_tensor(tmp_path: Path) -> None:
    out = tmp_path / "res.json"
    helper = Path(__file__).with_name("_zero3_push_worker.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(helper), str(out), str(free_port())]  # fmt: skip
    proc = subprocess.run(cmd, env=cli_env(), capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    print(res)
    assert res["partitioned"], "ZeRO-3 did not partition the parameters (the test would not test the gather)"
    assert res["tensors"] == res["expected"] and res["equal"]
    assert res["buckets"] > 1
