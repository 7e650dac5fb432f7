"""A tiny third-party package with ``sao.envs`` entry points (one good, one broken), pip-installed for the tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PLUGIN_ENV_ID = "sao/DemoEcho-v0"
DIST_NAME = "sao-demo-plugin"

_FILES = {
    "pyproject.toml": """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "sao-demo-plugin"
version = "0.1.0"

[project.entry-points."sao.envs"]
demo = "sao_demo_plugin:register"
broken = "sao_demo_plugin:broken"

[tool.setuptools]
packages = ["sao_demo_plugin"]
""",
    "sao_demo_plugin/__init__.py": """\
from sao.envs import register_env


def register():
    register_env("sao/DemoEcho-v0", "sao_demo_plugin.echo:EchoEnv", "Demo plugin: repeat the shown symbol.")


def broken():
    raise RuntimeError("this plugin is broken on purpose")
""",
    "sao_demo_plugin/autoreg.py": """\
from sao_demo_plugin import register

register()
""",
    "sao_demo_plugin/echo.py": """\
from sao.envs.token_game import TokenGameEnv


class EchoEnv(TokenGameEnv):
    def __init__(self, turns: int = 1, symbols: str = "AB") -> None:
        super().__init__(turns=turns, symbols=symbols, rule="copy", reward="all")
""",
}


def write_plugin(workdir: Path) -> Path:
    """Write the package's source tree under ``workdir/src`` (importable from there, but not installed)."""
    src = workdir / "src"
    for rel, text in _FILES.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    return src


def install_plugin(workdir: Path) -> Path:
    """Write the package and ``pip install`` it into ``workdir/site``; return that folder (put it on ``sys.path`` /
    ``PYTHONPATH`` and the package is installed, entry points included)."""
    src, site = write_plugin(workdir), workdir / "site"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*cmd, "--target", str(site), str(src)], check=True, capture_output=True, text=True, timeout=300)
    return site
