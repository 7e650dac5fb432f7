"""Offline Docker images for SWE tasks: a repo image per sdist and a thin bug image per task, tagged by content hash.

Layout inside both images (what the eval scripts and SWEEnv rely on): the repository is a git repo at ``/testbed``,
its dependencies live in the venv ``/opt/venv`` (first on ``PATH``), wheels in ``/wheels``; no network is needed.
A task image is its repo image plus one commit that injects the bug, so the task's ``base_commit`` is ``HEAD``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from envs.swe.tasks.fetch import SdistSpec

# Fixed identity and dates make the commits (hence base_commit) reproducible when an image is rebuilt.
GIT_ENV = (
    "GIT_AUTHOR_NAME=sao GIT_AUTHOR_EMAIL=sao@localhost GIT_AUTHOR_DATE=2020-01-01T00:00:00Z "
    "GIT_COMMITTER_NAME=sao GIT_COMMITTER_EMAIL=sao@localhost GIT_COMMITTER_DATE=2020-01-01T00:00:00Z"
)
GIT_EXCLUDES = ["__pycache__/", "*.pyc", ".pytest_cache/", ".hypothesis/", "build/", "dist/", ".eggs/"]
IMAGE_RECIPE_VERSION = "1"


class ImageBuildError(RuntimeError):
    """``docker build`` failed; the message carries the tail of its log."""


def image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def _docker_build(context: Path, tag: str, what: str, timeout: float = 1200) -> None:
    try:
        proc = subprocess.run(
            ["docker", "build", "--network", "none", "-q", "-t", tag, str(context)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={"DOCKER_BUILDKIT": "0", "PATH": "/usr/local/bin:/usr/bin:/bin", **_docker_env()},
        )
    except subprocess.TimeoutExpired as e:
        raise ImageBuildError(f"building {what} ({tag}) timed out after {timeout:.0f}s") from e
    if proc.returncode != 0:
        raise ImageBuildError(f"building {what} ({tag}) failed:\n{(proc.stderr or proc.stdout)[-3000:]}")


def _docker_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("DOCKER_") and k != "DOCKER_BUILDKIT"}


def _repo_dockerfile(base_image: str, test_deps: list[str], spec: SdistSpec) -> str:
    excludes = "\\n".join(GIT_EXCLUDES)
    return f"""FROM {base_image}
COPY wheels /wheels
COPY src /testbed
WORKDIR /testbed
ENV PATH=/opt/venv/bin:$PATH PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels PIP_DISABLE_PIP_VERSION_CHECK=1 \\
    PYTHONDONTWRITEBYTECODE=1
RUN python3 -m venv /opt/venv \\
 && pip install -q {" ".join(f"'{d}'" for d in test_deps)} \\
 && pip install -q -e . \\
 && git config --global user.name sao && git config --global user.email sao@localhost \\
 && git config --global --add safe.directory '*' \\
 && git init -q -b main . && printf '{excludes}\\n' >> .git/info/exclude \\
 && git add -A && {GIT_ENV} git commit -q -m 'Import {spec.name} {spec.version} from its sdist'
STOPSIGNAL SIGKILL
CMD ["sleep", "infinity"]
"""


def repo_image_tag(spec: SdistSpec, sdist: Path, wheels: Path, base_image: str, test_deps: list[str]) -> str:
    h = hashlib.sha256()
    h.update(IMAGE_RECIPE_VERSION.encode())
    h.update(hashlib.sha256(sdist.read_bytes()).digest())
    for w in sorted(wheels.glob("*.whl")):
        h.update(w.name.encode())
    h.update(_repo_dockerfile(base_image, test_deps, spec).encode())
    return f"sao-swe-{spec.slug}:{spec.version}-{h.hexdigest()[:12]}"


def ensure_repo_image(spec: SdistSpec, sdist: Path, wheels: Path, base_image: str, test_deps: list[str]) -> str:
    """Build (once) the image holding the pristine package at /testbed with its test deps installed."""
    tag = repo_image_tag(spec, sdist, wheels, base_image, test_deps)
    if image_exists(tag):
        return tag
    with tempfile.TemporaryDirectory(prefix="sao-swe-ctx-") as tmp:
        ctx = Path(tmp)
        shutil.copytree(wheels, ctx / "wheels", ignore=shutil.ignore_patterns(".complete"))
        with tarfile.open(sdist) as tf:
            tf.extractall(ctx / "unpacked", filter="data")
        tops = [p for p in (ctx / "unpacked").iterdir() if p.is_dir()]
        if len(tops) != 1:
            raise ImageBuildError(f"{sdist.name} does not unpack to one top-level folder; cannot use it as a repo")
        tops[0].rename(ctx / "src")
        (ctx / "Dockerfile").write_text(_repo_dockerfile(base_image, test_deps, spec))
        _docker_build(ctx, tag, f"the repo image of {spec}")
    return tag


def task_image_tag(repo_image: str, fix_patch: str) -> str:
    h = hashlib.sha256(f"{IMAGE_RECIPE_VERSION}\n{repo_image}\n{fix_patch}".encode()).hexdigest()[:12]
    repo, _, version = repo_image.rpartition(":")
    return f"{repo}:{version.split('-')[0]}-bug-{h}"


def ensure_task_image(repo_image: str, fix_patch: str, message: str = "Current state") -> str:
    """Build (once) ``repo_image`` + one commit injecting the bug, i.e. applying ``fix_patch`` in reverse."""
    tag = task_image_tag(repo_image, fix_patch)
    if image_exists(tag):
        return tag
    dockerfile = f"""FROM {repo_image}
COPY fix.diff /tmp/fix.diff
RUN cd /testbed && git apply -R /tmp/fix.diff && rm /tmp/fix.diff \\
 && git add -A && {GIT_ENV} git commit -q -m '{message}'
"""
    with tempfile.TemporaryDirectory(prefix="sao-swe-task-") as tmp:
        (Path(tmp) / "Dockerfile").write_text(dockerfile)
        (Path(tmp) / "fix.diff").write_text(fix_patch)
        _docker_build(Path(tmp), tag, "a task image")
    return tag
