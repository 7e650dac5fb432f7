"""The Ray engine actor's /tmp work dirs (a model copy and the server's log, ~30 MB each) do not pile up: ``stop``
deletes its own, and a new actor sweeps those whose owner died without ``stop`` (killed with SIGKILL)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sao.trainer.cluster import engine_host


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_dirs_of_dead_owners_are_swept_and_live_ones_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead, live, unmarked = (tmp_path / f"sao-engine-{n}" for n in ("dead", "live", "new"))
    for d in (dead, live, unmarked):
        (d / "model").mkdir(parents=True)
    (dead / "owner.pid").write_text(str(_dead_pid()))
    (live / "owner.pid").write_text(str(os.getpid()))
    engine_host._sweep_dead_work_dirs()
    assert not dead.exists(), "a killed actor's work dir was left in /tmp"
    assert live.exists() and unmarked.exists(), "a live actor's dir, or one being created, was deleted"


def test_stop_deletes_the_actors_own_work_dir(tmp_path: Path) -> None:
    host = engine_host.EngineHostImpl()
    host.work = tmp_path / "sao-engine-x"
    (host.work / "model").mkdir(parents=True)
    host.stop()
    assert not (tmp_path / "sao-engine-x").exists() and host.work is None
    host.stop()  # a second stop (atexit after an explicit one) is harmless
