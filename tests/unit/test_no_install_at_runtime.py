"""Runtime code never installs: only the setup steps and the one command allowed to build (``sao tasks build``)
import ``sao.core.setup``; a missing base image is an error naming the setup step, never a build."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What may call the installer: the steps themselves and `sao tasks build` (it makes the engine and base image first).
ALLOWED = {"sao/core/setup.py", "sao/cli/tasks.py"}


def _imports_setup(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        if "sao.core.setup" in names:
            return True
    return False


def test_only_the_setup_steps_and_sao_tasks_build_import_the_installer() -> None:
    offenders = []
    for path in sorted((ROOT / "sao").rglob("*.py")):  # sao/envs, sao/agent, ... link to the top-level folders
        shown = path.relative_to(ROOT).as_posix()
        if shown not in ALLOWED and _imports_setup(path):
            offenders.append(shown)
    assert not offenders, f"runtime code imports the installer (sao.core.setup): {offenders}"


def test_the_checker_sees_both_spellings(tmp_path: Path) -> None:
    for text in ("from sao.core.setup import ensure_base_image\n", "from sao.core import setup\n"):
        (tmp_path / "m.py").write_text("def f():\n    " + text)
        assert _imports_setup(tmp_path / "m.py")


def test_a_missing_base_image_names_the_setup_step(monkeypatch: pytest.MonkeyPatch) -> None:
    import sao.sandboxes.images as images
    from sao.core.base_image import base_image_tag
    from sao.sandboxes.protocols import ImageNotFoundError

    monkeypatch.setattr(images, "image_exists", lambda tag, docker_host=None: False)
    for call in (images.require_base_image, lambda: images.ensure_image(base_image_tag())):
        with pytest.raises(ImageNotFoundError, match=r"sao-base:\w+.* is not on the Docker host; make it with "
                                                     r"`python -m sao.core.setup image`"):  # fmt: skip
            call()
    monkeypatch.setattr(images, "image_exists", lambda tag, docker_host=None: True)
    assert images.require_base_image() == base_image_tag()
