"""trainer.runs.run_folder: the one writer of checkpoints and summary files (durable, atomic, latest, refusal)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sao.core.jsonl import write_json_atomic
from sao.trainer.config import ConfigError
from sao.trainer.runs.run_folder import (
    STATE_FILE,
    checkpoint_paths,
    commit_checkpoint,
    latest_checkpoint,
    latest_state,
    refuse_existing_run,
)


def _write(run: Path, step: int, keep: int = 2) -> Path:
    ckpt, partial = checkpoint_paths(run, step)
    partial.mkdir(parents=True)
    (partial / "weights.bin").write_bytes(b"x" * 10)
    commit_checkpoint(partial, ckpt, {"step": step}, keep)
    return ckpt


def test_a_checkpoint_is_fsynced_renamed_and_becomes_latest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    ckpt = _write(tmp_path, 3)
    assert ckpt.name == "step_000003" and not list((tmp_path / "checkpoints").glob(".*partial"))
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_000003"
    # the weights, the state file and the folder were fsynced before the rename, the marker after it
    assert any(p.endswith("/weights.bin") for p in synced) and any(p.endswith(STATE_FILE) for p in synced)
    assert any("/.latest." in p and p.endswith(".tmp") for p in synced)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_000003"]
    state = latest_state(tmp_path)
    assert state is not None and state["step"] == 3 and state["_dir"] == str(ckpt)


def test_only_the_newest_checkpoints_are_kept(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        _write(tmp_path, step, keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == ["step_000002", "step_000003"]


def test_a_failed_write_leaves_the_previous_checkpoint_latest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, 1)
    ckpt, partial = checkpoint_paths(tmp_path, 2)
    partial.mkdir()
    (partial / "weights.bin").write_bytes(b"y")
    real = os.replace

    def full_disk(src: object, dst: object) -> None:
        if str(dst).endswith("step_000002"):
            raise OSError(28, "No space left on device")
        real(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space"):
        commit_checkpoint(partial, ckpt, {"step": 2}, keep=2)
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_000001"
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))


def test_an_incomplete_latest_falls_back_to_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    _write(tmp_path, 1)
    (tmp_path / "checkpoints" / "step_000002").mkdir()  # no state file: not complete
    (tmp_path / "checkpoints" / "latest").write_text("step_000002")
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_000001"
    assert latest_state(tmp_path / "nothing") is None


def test_json_is_written_atomically_and_an_existing_run_is_refused(tmp_path: Path) -> None:
    write_json_atomic(tmp_path / "summary.json", {"a": (1, 2), "p": tmp_path})
    assert json.loads((tmp_path / "summary.json").read_text()) == {"a": [1, 2], "p": str(tmp_path)}
    assert not list(tmp_path.glob("*.tmp"))
    refuse_existing_run(tmp_path, "train")  # no config.yaml: fine
    (tmp_path / "config.yaml").write_text("{}")
    with pytest.raises(ConfigError, match=r"sao sft --resume"):
        refuse_existing_run(tmp_path, "sft")
