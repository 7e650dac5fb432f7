"""`sao sft` on bad input: exit code 2 and a message naming the file, the line and the fix, before any training."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner


def test_sao_sft_refuses_a_conversation_without_an_assistant_turn(tmp_path: Path, smollm2_dir: Path) -> None:
    from sao.cli.main import app

    data = tmp_path / "conv.jsonl"
    good = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "\\boxed{4}"}]}
    bad = {"messages": [{"role": "user", "content": "2+2?"}]}
    data.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"run": {"dir": str(tmp_path / "run")}, "model": {"path": "tiny:llama"}}))
    res = CliRunner().invoke(app, ["sft", str(cfg), "--data", str(data), "--min-reward", "1"])
    assert res.exit_code == 2, res.output
    assert f"{data}:2:" in res.output and "no assistant message" in res.output and "add one" in res.output
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_sao_sft_without_data_says_how_to_give_it(tmp_path: Path) -> None:
    from sao.cli.main import app

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"run": {"dir": str(tmp_path / "run")}, "model": {"path": "tiny:llama"}}))
    res = CliRunner().invoke(app, ["sft", str(cfg)])
    assert res.exit_code == 2 and "sft.data is empty" in res.output
