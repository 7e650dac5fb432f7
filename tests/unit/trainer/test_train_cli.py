"""`sao train --resume DIR` on a folder no run wrote: exit 2, a message about resuming, and nothing written there."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner


def test_resume_of_a_folder_that_holds_no_run_says_so_and_writes_nothing(tmp_path: Path) -> None:
    from sao.cli.main import app

    empty = tmp_path / "not_a_run"
    empty.mkdir()
    res = CliRunner().invoke(app, ["train", "--resume", str(empty)])
    assert res.exit_code == 2, res.output
    assert "holds no run" in res.output and "sao train CONFIG" in res.output, res.output
    assert list(empty.iterdir()) == [], f"a refused resume wrote {list(empty.iterdir())}"


def test_resume_of_a_missing_folder_says_so_and_creates_nothing(tmp_path: Path) -> None:
    from sao.cli.main import app

    missing = tmp_path / "nowhere"
    res = CliRunner().invoke(app, ["train", "--resume", str(missing)])
    assert res.exit_code == 2 and "no such folder" in res.output, res.output
    assert not missing.exists()
