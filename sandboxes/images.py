"""Offline images: the base image, and task images built from it with no network, cached by a content hash.

The base image is made by ``python -m sao.core.setup image`` (``bash scripts/setup.sh``); here it is only looked up
(``require_base_image``: its tag, or an error naming that command). Use from a task builder (e.g. ``envs/swe``)::

    from sao.sandboxes.images import build_task_image, pip_offline_lines, require_base_image

    tag = build_task_image(
        "sao-task-click",                      # repository part of the tag
        require_base_image(),                  # FROM this image (any local tag)
        {"repo": Path("/path/to/click"),       # context path -> host dir / host file / bytes
         "wheels": Path("/path/to/wheels"),
         "setup.sh": b"cd /testbed && git init -q ...\n"},
        ["COPY repo /testbed", *pip_offline_lines("wheels", ["-e /testbed", "pytest"]), "RUN sh /setup.sh"],
    )
    # tag == "sao-task-click:<16 hex>"; the same inputs give the same tag and skip the build.

Builds use the legacy builder through the SDK with ``network_mode="none"``: a RUN step that needs the network
fails the build instead of silently downloading. Every Dockerfile gets ``STOPSIGNAL SIGKILL`` (PID 1 of our
images is ``sleep``, which ignores SIGTERM; without it ``docker stop`` waits 10-15 s). Failures raise
``ImageNotFoundError`` with the tail of the build log.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import docker.errors
import requests

from sao.core.base_image import BASE_IMAGE_NAME
from sao.sandboxes.base_image import base_image_tag, missing_image
from sao.sandboxes.docker import get_client
from sao.sandboxes.protocols import ImageNotFoundError, SandboxError

ContextSource = Path | str | bytes
_TAG_REPO_RE = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")


def image_exists(tag: str, docker_host: str | None = None) -> bool:
    client = get_client(docker_host)
    try:
        client.api.inspect_image(tag)
        return True
    except docker.errors.ImageNotFound:
        return False
    except docker.errors.NotFound:
        return False


def require_base_image(docker_host: str | None = None) -> str:
    """The tag of the offline base image when the Docker host has it; else an ``ImageNotFoundError`` naming the
    setup step that makes it (runtime code never builds it)."""
    tag = base_image_tag()
    if not image_exists(tag, docker_host):
        raise missing_image(tag)
    return tag


def ensure_image(tag: str, docker_host: str | None = None, pull: bool = True) -> str:
    """Make sure ``tag`` is on the daemon: present, or pulled. The base image is never pulled: its absence is an
    ``ImageNotFoundError`` naming the setup step; other failures say how to build the image instead."""
    if image_exists(tag, docker_host):
        return tag
    if tag.split(":")[0] == BASE_IMAGE_NAME:  # on no registry: made by the setup step
        raise missing_image(tag)
    pull_error = "pulling disabled"
    if pull:
        try:
            get_client(docker_host).images.pull(tag)
            return tag
        except (docker.errors.APIError, requests.exceptions.RequestException) as e:
            pull_error = str(e)
    raise ImageNotFoundError(
        f"image {tag!r} is not on the Docker host and could not be pulled ({pull_error}); build it offline with "
        "sao.sandboxes.images.build_task_image(...) or check the tag"
    )


def _hash_source(h: Any, name: str, src: ContextSource) -> None:
    h.update(f"\0{name}\0".encode())
    if isinstance(src, bytes):
        h.update(b"bytes\0" + src)
        return
    path = Path(src)
    if path.is_dir():
        for p in sorted(path.rglob("*")):
            rel = p.relative_to(path).as_posix()
            if p.is_symlink():
                h.update(f"L{rel}\0{os.readlink(p)}\0".encode())
            elif p.is_file():
                h.update(f"F{rel}\0{p.stat().st_mode & 0o111}\0".encode())
                with open(p, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        h.update(block)
            elif p.is_dir():
                h.update(f"D{rel}\0".encode())
    elif path.is_file():
        h.update(f"F\0{path.stat().st_mode & 0o111}\0".encode())
        h.update(path.read_bytes())
    else:
        raise ImageNotFoundError(f"build input {name!r}: host path {path} does not exist")


def content_hash(dockerfile_text: str, context: Mapping[str, ContextSource], extra: str = "") -> str:
    """Hex digest over the Dockerfile, every context input (names, bytes, executable bits) and ``extra``."""
    h = hashlib.sha256(dockerfile_text.encode() + b"\0" + extra.encode())
    for name in sorted(context):
        _hash_source(h, name, context[name])
    return h.hexdigest()


def _with_stopsignal(dockerfile_text: str) -> str:
    if re.search(r"^\s*STOPSIGNAL\s", dockerfile_text, re.MULTILINE | re.IGNORECASE):
        return dockerfile_text
    return dockerfile_text.rstrip("\n") + "\nSTOPSIGNAL SIGKILL\n"


def _build(tag: str, dockerfile_text: str, context: Mapping[str, ContextSource], docker_host: str | None) -> None:
    client = get_client(docker_host)
    with tempfile.TemporaryFile() as f:
        with tarfile.open(fileobj=f, mode="w") as tar:
            for name, src in context.items():
                if isinstance(src, bytes):
                    info = tarfile.TarInfo(name)
                    info.size = len(src)
                    info.mode = 0o644
                    tar.addfile(info, io.BytesIO(src))
                else:
                    tar.add(str(src), arcname=name)
            df = dockerfile_text.encode()
            info = tarfile.TarInfo("Dockerfile.sao")
            info.size = len(df)
            tar.addfile(info, io.BytesIO(df))
        f.seek(0)
        log: list[str] = []
        try:
            for event in client.api.build(
                fileobj=f,
                custom_context=True,
                dockerfile="Dockerfile.sao",
                tag=tag,
                rm=True,
                forcerm=True,
                pull=False,
                network_mode="none",
                decode=True,
            ):
                if "stream" in event:
                    log.append(str(event["stream"]))
                if "error" in event:
                    tail = "".join(log)[-3000:]
                    raise ImageNotFoundError(f"building {tag} failed: {event['error'].strip()}\n{tail}")
        except docker.errors.APIError as e:
            raise ImageNotFoundError(f"building {tag} failed: {e.explanation or e}\n{''.join(log)[-3000:]}") from e
    if not image_exists(tag, docker_host):
        raise ImageNotFoundError(f"building {tag} reported success but the image is missing:\n{''.join(log)[-3000:]}")


def _check_prefix(tag_prefix: str) -> None:
    if not _TAG_REPO_RE.match(tag_prefix):
        raise ValueError(
            f"tag prefix {tag_prefix!r} is not a valid image name: use lowercase letters, digits and . _ - /"
        )


def build_image(
    tag_prefix: str,
    dockerfile_text: str,
    context: Mapping[str, ContextSource] | None = None,
    docker_host: str | None = None,
) -> str:
    """Build (or reuse) an image from a Dockerfile and a context given as ``{path in context: source}``.

    A source is a host directory, a host file, or ``bytes``. Returns ``"<tag_prefix>:<16 hex>"`` where the hex is
    ``content_hash`` of the Dockerfile (with ``STOPSIGNAL SIGKILL`` added when absent), the inputs and the image id
    of every local ``FROM`` image (so a rebuilt base rebuilds its children). A tag that exists is returned at once.
    Raises ``ImageNotFoundError`` when a ``FROM`` image is missing or the build fails (the log tail included)."""
    _check_prefix(tag_prefix)
    context = dict(context or {})
    text = _with_stopsignal(dockerfile_text)
    base_ids = []
    for base in re.findall(r"^\s*FROM\s+(\S+)", text, re.MULTILINE | re.IGNORECASE):
        if base.lower() == "scratch":
            continue
        ensure_image(base, docker_host, pull=False)
        base_ids.append(get_client(docker_host).api.inspect_image(base)["Id"])
    tag = f"{tag_prefix}:{content_hash(text, context, ','.join(base_ids))[:16]}"
    if image_exists(tag, docker_host):
        return tag
    try:
        _build(tag, text, context, docker_host)
    except (requests.exceptions.ConnectionError, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise ImageNotFoundError(f"building {tag}: {e}") from e
        raise SandboxError(f"building {tag}: lost the Docker daemon ({e})") from e
    return tag


def build_image_from_dir(
    context_dir: Path | str, dockerfile_text: str, tag_prefix: str, docker_host: str | None = None
) -> str:
    """``build_image`` with a whole host directory as the build context (the Dockerfile is given as text)."""
    root = Path(context_dir)
    if not root.is_dir():
        raise ImageNotFoundError(f"build context {root} is not a directory")
    return build_image(tag_prefix, dockerfile_text, {p.name: p for p in sorted(root.iterdir())}, docker_host)


def build_task_image(
    name_prefix: str,
    base: str,
    context_files: Mapping[str, ContextSource],
    dockerfile_lines: Iterable[str],
    docker_host: str | None = None,
) -> str:
    """A task image ``FROM base`` with ``dockerfile_lines`` after it (COPY paths refer to ``context_files`` keys).
    Same contract as ``build_image``; typical lines: ``COPY repo /testbed``, ``pip_offline_lines(...)``,
    ``WORKDIR /testbed``. Base image: ``require_base_image()``."""
    text = "\n".join([f"FROM {base}", *dockerfile_lines]) + "\n"
    return build_image(name_prefix, text, context_files, docker_host)


def pip_offline_lines(wheels_in_context: str, requirements: Iterable[str], python: str = "python3") -> list[str]:
    """Dockerfile lines installing ``requirements`` from wheels copied into the image, with no index.
    ``requirements`` are pip arguments (``"pytest==8.3.2"``, ``"-e /testbed"``). The venv at /opt/venv goes
    first on PATH (Debian's system pip refuses installs outside a venv). The venv costs a few seconds per build:
    put these lines before ``COPY repo ...`` when the requirements do not need the repository, so that Docker's
    layer cache keeps them across rebuilds of a changed repository."""
    reqs = " ".join(requirements)
    return [
        f"COPY {wheels_in_context} /wheels",
        f"RUN {python} -m venv /opt/venv && /opt/venv/bin/pip install -q --no-index --find-links /wheels {reqs}",
        "ENV PATH=/opt/venv/bin:$PATH",
    ]


def download_wheels(requirements: Iterable[str], dest: Path | str) -> list[Path]:
    """``pip download`` wheels for ``requirements`` on the host into ``dest`` (for the image's CPython 3.11,
    manylinux x86_64) so that ``pip_offline_lines`` can install them with no network. Returns the wheels."""
    reqs = list(requirements)
    out = Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.11",
           "--implementation", "cp", "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64",
           "-d", str(out), *reqs]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise ImageNotFoundError(f"`pip download` of {reqs} failed: {proc.stderr[-2000:]}")
    return sorted(out.glob("*.whl"))
