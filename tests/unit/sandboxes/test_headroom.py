"""The host's process table against the sandboxes a run may hold at once (kernel.pid_max x concurrency x pids)."""

from __future__ import annotations

from pathlib import Path

import pytest

import sao.sandboxes.headroom as headroom
from sao.sandboxes.headroom import HOST_MARGIN, check_pid_headroom, pid_headroom_error


def test_what_fits_passes_and_what_does_not_says_the_numbers_and_the_fixes() -> None:
    # the case: 32 graders of 1,024 pids on a 32,768 table
    error = pid_headroom_error(32, 1024, 32768, 500, "concurrency")
    assert error is not None
    fit = (32768 - 500 - HOST_MARGIN) // 1024
    for said in ("concurrency=32", "32768 processes", "kernel.pid_max is 32768", f"at most {fit} fit", "pids_limit"):
        assert said in error, said
    # the SWE env's default: agent + grader at 512 each, 8 episodes at once
    assert pid_headroom_error(8, 1024, 32768, 500, "concurrency") is None


def test_the_check_reads_this_hosts_table_and_skips_a_remote_daemon(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pid_max, loadavg = tmp_path / "pid_max", tmp_path / "loadavg"
    pid_max.write_text("32768\n")
    loadavg.write_text("0.5 0.4 0.3 2/1500 999\n")
    monkeypatch.setattr(headroom, "PID_MAX_PATH", pid_max)
    monkeypatch.setattr(headroom, "LOADAVG_PATH", loadavg)
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    check_pid_headroom(8, 1024, "concurrency")
    with pytest.raises(ValueError, match=r"with 1500 running"):
        check_pid_headroom(32, 1024, "concurrency")
    check_pid_headroom(32, 1024, "concurrency", docker_host="tcp://10.0.0.2:2375")  # its own table, not ours
    pid_max.write_text("4194304\n")
    check_pid_headroom(32, 1024, "concurrency")
