"""``pip install .`` leaves one importable name, ``sao``, at the top level of site-packages (and the console script):
a user's own ``envs/`` or ``agent/`` folder can never shadow ours."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_wheel_installs_only_the_sao_namespace(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), "."]
    res = subprocess.run(build, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    (wheel,) = wheels.glob("sao-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "sao/envs/swe/env.py" in names and "sao/trainer/algos/advantages.py" in names, names[:20]
    assert any(n.startswith("sao/envs/data/") for n in names), "the envs' data files are missing from the wheel"
    page = {"index.html", "app.js", "style.css", "uplot.min.js", "uplot.min.css", "uplot.LICENSE.txt"}
    assert {f"sao/eval/view/static/{f}" for f in page} <= set(names), "`sao view`'s page is missing from the wheel"

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (site,) = venv.glob("lib/python*/site-packages")
    install = [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)]
    res = subprocess.run(install, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    top = {p.name for p in site.iterdir() if not p.name.endswith(".dist-info") and p.name not in {"bin", "__pycache__"}}
    assert top == {"sao"}, f"top-level names in site-packages besides sao: {sorted(top - {'sao'})}"
    probe = "import importlib.util as u; print(u.find_spec('sao.envs').origin)"
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the fresh venv alone, not this checkout
    out = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).is_relative_to(site), out.stdout


@pytest.mark.slow
def test_a_clone_without_symlinks_refuses_to_build(tmp_path: Path) -> None:
    """With ``core.symlinks=false`` git writes sao/agent etc. as text files; the build must fail loudly, not ship a
    wheel that lacks five packages."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "-c", "core.symlinks=false", str(ROOT), str(clone)], check=True, timeout=120)
    assert (clone / "sao" / "agent").is_file(), "git made a symlink anyway; this test needs core.symlinks=false"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), "."]
    res = subprocess.run(build, cwd=clone, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0, "a checkout without the linked packages built a wheel"
    assert "sao build refused" in res.stdout + res.stderr and "core.symlinks" in res.stdout + res.stderr
    assert not list(tmp_path.glob("sao-*.whl"))
