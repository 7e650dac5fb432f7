"""Envs from the user's own package: a pip-installed `sao.envs` entry point and the `module:sao/Name-v0` form are
listed and checked by `sao envs`; a bad env id or kwarg stops `sao train` before any model or episode."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests._plugin_env import DIST_NAME, PLUGIN_ENV_ID, install_plugin, write_plugin

ROOT = Path(__file__).resolve().parents[3]


def _sao(args: list[str], pythonpath: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=f"{pythonpath}{os.pathsep}{ROOT}", COLUMNS="200")
    cmd = [sys.executable, "-m", "sao.cli.main", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_plugin(tmp_path_factory.mktemp("plugin"))


def test_installed_plugin_env_is_listed_and_checked(site: Path) -> None:
    res = _sao(["envs", "list"], site)
    assert res.returncode == 0, res.stderr
    row = next(line for line in res.stdout.splitlines() if PLUGIN_ENV_ID in line)
    assert DIST_NAME in row and "sao/TokenGame-v0" in res.stdout
    # The broken entry point is reported by name, and does not hide the others.
    assert "broken" in res.stdout and "this plugin is broken on purpose" in res.stdout
    res = _sao(["envs", "check", PLUGIN_ENV_ID], site)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"ok       {PLUGIN_ENV_ID}" in res.stdout


def test_module_colon_id_form_without_installing(tmp_path: Path) -> None:
    src = write_plugin(tmp_path)  # importable, but no entry point: only the module form can find the env
    res = _sao(["envs", "check", PLUGIN_ENV_ID], src)
    assert res.returncode == 1 and "doesn't exist" in res.stdout
    res = _sao(["envs", "check", f"sao_demo_plugin.autoreg:{PLUGIN_ENV_ID}"], src)
    assert res.returncode == 0 and "ok" in res.stdout, res.stdout + res.stderr
    res = _sao(["envs", "check", f"no_such_pkg.mod:{PLUGIN_ENV_ID}"], src)
    assert res.returncode == 1 and "cannot import module 'no_such_pkg.mod'" in res.stdout
    res = _sao(["envs", "check", f"sao_demo_plugin.autoreg:{PLUGIN_ENV_ID}", "--kwargs", '{"turns": 0}'], src)
    assert res.returncode == 1 and "TokenGame turns must be >= 1" in res.stdout


def test_bad_env_kwarg_or_id_fails_before_the_first_episode(tmp_path: Path) -> None:
    from sao.cli.main import app

    run_dir = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", str(ROOT / "configs/toy.yaml"), f"run.dir={run_dir}", "env.kwargs.bogus=1"])
    assert res.exit_code == 2, res.output
    # The constructor's own error, named for the user, and nothing was started or written.
    assert "unexpected keyword argument 'bogus'" in res.output and "fix env.kwargs" in res.output
    assert not run_dir.exists()
    res = CliRunner().invoke(app, ["train", str(ROOT / "configs/toy.yaml"), f"run.dir={run_dir}", "env.id=sao/Nope-v0"])
    assert res.exit_code == 2 and "unknown env id 'sao/Nope-v0'" in res.output and "sao.envs" in res.output
    assert not run_dir.exists()


def test_preflight_makes_the_env_once() -> None:
    from sao.envs.registration import EnvSetupError, preflight

    preflight("sao/TokenGame-v0", {"turns": 2})
    with pytest.raises(EnvSetupError, match="TokenGame turns must be >= 1"):
        preflight("sao/TokenGame-v0", {"turns": 0})  # a ValueError raised by the constructor itself
    with pytest.raises(EnvSetupError, match=r"unknown env id 'sao/TokenGame-v9' \(did you mean 'sao/TokenGame-v0'\?\)"):
        preflight("sao/TokenGame-v9")


def test_preflight_fails_on_a_sandbox_backend_that_does_not_answer(tmp_path: Path) -> None:
    """A stopped Docker daemon fails the run before its first episode with the fix in the message (measured: a main
    job whose daemon had stopped played 64 collect episodes as infra errors, then failed in SFT)."""
    from sao.envs.registration import EnvSetupError, preflight

    dead = {"backend": "docker", "docker_host": f"unix://{tmp_path}/no-daemon.sock"}
    with pytest.raises(EnvSetupError, match=r"cannot reach its sandbox backend: the Docker daemon .*start dockerd"):
        preflight("sao/PythonTool-v0", {"sandbox": dead})
    with pytest.raises(EnvSetupError, match="cannot reach its sandbox backend: the Docker daemon"):
        preflight("sao/SWE-v0", {"tasks": [], "sandbox": dead})


def test_register_env_doc_config_loads(tmp_path: Path) -> None:
    import re

    from sao.trainer.config import load_config

    doc = (ROOT / "docs" / "register_env.md").read_text()
    (block,) = re.findall(r"```yaml\n(.*?)```", doc, re.DOTALL)
    cfg_file = tmp_path / "reverse.yaml"
    cfg_file.write_text(block)
    cfg = load_config(cfg_file)
    assert cfg.env.id == "sao/Reverse-v0" and cfg.env.kwargs == {"max_steps": 5} and cfg.model.path == "smollm2"


def test_list_shows_sao_and_plugin_envs_only_with_their_origin() -> None:
    from sao.envs.registration import env_origin, list_envs

    ids = [i for i, _ in list_envs()]
    assert "sao/TokenGame-v0" in ids and env_origin("sao/TokenGame-v0") == "sao"
    assert not any(i.startswith("CartPole") for i in ids)  # Gymnasium's own envs are not ours to list
