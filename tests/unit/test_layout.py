"""Layout rules: imports go one way (sao.core <- sandboxes <- envs <- agent <- eval <- trainer <- benchmarks <- cli),
every part imports under the one ``sao`` namespace, and `sao --help` lists the subcommands quickly."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ["sao.core", "sao.sandboxes", "sao.envs", "sao.agent", "sao.eval", "sao.trainer", "sao.benchmarks", "sao.cli"]
OLD_TOP_LEVELS = {"saocore", "sao_cli", "envs", "agent", "trainer", "sandboxes", "benchmarks"}


def _layer(module: str) -> str:
    """``sao.envs.swe.env`` -> ``sao.envs``; any other module -> its top-level name."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "sao" and len(parts) > 1 else parts[0]


def _imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(_layer(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(_layer(node.module))
    return names


def _sources(pkg: str) -> list[Path]:
    return sorted((ROOT / pkg.replace(".", "/")).resolve().rglob("*.py"))


def test_imports_go_one_way() -> None:
    violations = []
    for rank, pkg in enumerate(LAYERS):
        for path in _sources(pkg):
            imported = _imported_top_levels(path)
            upward = imported & set(LAYERS[rank + 1 :])
            for name in sorted(upward):
                violations.append(f"{path.relative_to(ROOT)} imports {name} (a higher layer than {pkg})")
            for name in sorted(imported & OLD_TOP_LEVELS):
                violations.append(f"{path.relative_to(ROOT)} imports {name}: import it as sao.{name}")
    assert not violations, "imports must go " + " <- ".join(LAYERS) + ":\n" + "\n".join(violations)


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "m.py"
    bad.write_text("import sao.trainer.algos\nfrom sao.agent.records import Trajectory\nimport envs.base\n")
    assert {"sao.trainer", "sao.agent", "envs"} <= _imported_top_levels(bad)


@pytest.mark.parametrize("pkg", LAYERS[:-1])
def test_packages_import_by_folder_name(pkg: str) -> None:
    __import__(pkg)


def test_sao_help_is_instant_and_lists_subcommands() -> None:
    exe = Path(sys.executable).parent / "sao"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "sao.cli.main"]
    out = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    for sub in ("train", "eval", "envs", "tasks", "bench", "serve"):
        assert sub in out.stdout, f"`sao --help` does not list {sub!r}:\n{out.stdout}"
    # Instant help means no heavy import at CLI import time (its wall time is measured in docs/benchmarks.md).
    heavy_mods = ("torch", "transformers", "vllm", "deepspeed", "docker")
    probe = f"import sys, sao.cli.main; print(' '.join(m for m in {heavy_mods!r} if m in sys.modules))"
    heavy = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert heavy.stdout.strip() == "", f"importing the CLI pulls in heavy modules: {heavy.stdout}"
