"""Offline task images: built from the base image with no network, cached by content hash, clear failures."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import pytest

from sao.sandboxes.config import SandboxConfig
from sao.sandboxes.docker import DockerSandbox
from sao.sandboxes.images import ContextSource, build_image_from_dir, build_task_image, ensure_image, pip_offline_lines
from sao.sandboxes.protocols import ImageNotFoundError

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leftovers"), pytest.mark.timeout(300)]


def make_wheel(dest: Path, name: str = "saodemo", version: str = "0.1") -> Path:
    """A minimal pure-Python wheel written by hand (no build backend, no network)."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": "VALUE = 42\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: sao-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{p},,\n" for p in files) + f"{dist}/RECORD,,\n"
    path = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, text in {**files, f"{dist}/RECORD": record}.items():
            zf.writestr(p, text)
    return path


async def test_task_image_offline_build_cache_and_run(base_image: str, tmp_path: Path, docker_client: Any) -> None:
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "code.py").write_text("def f():\n    return 1\n")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels)
    lines = ["COPY repo /testbed", *pip_offline_lines("wheels", ["saodemo"]), "COPY note.txt /note.txt",
             "WORKDIR /testbed"]  # fmt: skip
    context: dict[str, ContextSource] = {"repo": repo, "wheels": wheels, "note.txt": b"from bytes\n"}
    tag = build_task_image("sao-test-task", base_image, context, lines)
    assert tag.startswith("sao-test-task:")
    try:
        assert build_task_image("sao-test-task", base_image, context, lines) == tag  # cached: same inputs
        cfg = docker_client.api.inspect_image(tag)["Config"]
        assert cfg["StopSignal"] == "SIGKILL"
        async with await DockerSandbox.create(SandboxConfig(image=tag)) as sb:
            r = await sb.exec("pwd; cat pkg/code.py /note.txt; python -c 'import saodemo; print(saodemo.VALUE)'", 30)
            assert r.output == "/testbed\ndef f():\n    return 1\nfrom bytes\n42\n", r.output
    finally:
        docker_client.api.remove_image(tag, force=True)


async def test_build_failures_are_image_not_found(base_image: str, tmp_path: Path) -> None:
    with pytest.raises(ImageNotFoundError, match="sao-no-such-base"):
        build_task_image("sao-test-bad", "sao-no-such-base:1", {}, ["RUN true"])
    # Builds have no network: a step that downloads fails the build, with its log in the message.
    with pytest.raises(ImageNotFoundError, match=r"building sao-test-net.*(unreachable|resolve|urlopen)"):
        build_task_image(
            "sao-test-net",
            base_image,
            {},
            ["RUN python3 -c \"import urllib.request as u; u.urlopen('http://1.1.1.1')\""],
        )
    (tmp_path / "a.txt").write_text("a")
    with pytest.raises(ImageNotFoundError, match=r"COPY failed|no such file|not found"):
        build_image_from_dir(tmp_path, f"FROM {base_image}\nCOPY missing.txt /m\n", "sao-test-ctx")
    with pytest.raises(ImageNotFoundError, match="could not be pulled"):
        ensure_image("sao-no-such-image:0", pull=False)
    with pytest.raises(ValueError, match="tag prefix"):
        build_task_image("Bad Prefix", base_image, {}, [])
