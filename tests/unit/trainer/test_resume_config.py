"""A resume changes only what a resume may change: a staged run is checked like a plain one, before anything runs
or config.yaml is rewritten, and the refusal names the fields that differ and the ones a resume may change."""

from __future__ import annotations

from pathlib import Path

import pytest

from sao.trainer.config import ConfigError, load_config, resumed_config, save_config
from sao.trainer.runs.run import train

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def saved_run(tmp_path: Path, name: str) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    save_config(load_config(CONFIGS / name, [f"run.dir={run}"]), run / "config.yaml")
    return run


@pytest.mark.parametrize("name", ["quickstart.yaml", "toy.yaml"])  # a staged run and a plain one
def test_a_resume_that_changes_the_config_is_refused_naming_the_fields(tmp_path: Path, name: str) -> None:
    run = saved_run(tmp_path, name)
    before = (run / "config.yaml").read_text()
    with pytest.raises(ConfigError) as e:
        train(None, ["trainer.lr=0.5", "trainer.gamma=0.9", "run.total_steps=99"], resume=str(run))
    msg = str(e.value)
    assert "['trainer.gamma', 'trainer.lr']" in msg  # the fields that differ, and only those
    assert "may change only" in msg and "run.total_steps" in msg  # what a resume may change
    assert (run / "config.yaml").read_text() == before  # the run's record of its config is untouched


def test_a_staged_resume_given_another_config_file_is_refused(tmp_path: Path) -> None:
    run = saved_run(tmp_path, "quickstart.yaml")
    with pytest.raises(ConfigError, match=r"sft\.steps"):
        train(str(CONFIGS / "quickstart.yaml"), ["sft.steps=9"], resume=str(run))


def test_what_a_resume_may_change_passes(tmp_path: Path) -> None:
    run = saved_run(tmp_path, "quickstart.yaml")
    more = load_config(run / "config.yaml", ["run.total_steps=30", "run.plot=false"])
    saved = resumed_config(more, run)
    assert saved.run.total_steps == 8  # the saved config comes back; the caller applies what may change


def test_a_resume_without_a_saved_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no config\.yaml there"):
        resumed_config(load_config(CONFIGS / "toy.yaml"), tmp_path)
