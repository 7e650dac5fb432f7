"""Offline Docker images for SWE tasks: a repo image per sdist and a thin bug image per task, tagged by content hash.

Layout inside both images (what the eval scripts and SWEEnv rely on): the repository is a git repo at ``/testbed``,
its dependencies live in the venv ``/opt/venv`` (first on ``PATH``); no network is needed.

No reachable fix: a task image must not hand the agent the original (fixed) source. So
- the task image's ``/testbed`` repository is made fresh from the buggy tree: ONE commit (``base_commit`` = ``HEAD``),
  no reflog, no other refs, no object holding a fixed file (the repo image's history is deleted in the same layer;
  lower image layers are not visible inside a container);
- the repo image installs the package editable (site-packages points at ``/testbed``, no copy), never gets the
  package's own wheel (it is left out of the build context), and deletes ``/wheels``, pip's cache and ``/tmp``
  after installing, so no archive of the package is left anywhere in the image.
``tests/integration/swe/test_task_integrity.py`` audits every image the builder makes for exactly this.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from sao.envs.swe.tasks.fetch import SdistSpec

# Fixed identity and dates make the commits (hence base_commit) reproducible when an image is rebuilt.
GIT_ENV = (
    "GIT_AUTHOR_NAME=sao GIT_AUTHOR_EMAIL=sao@localhost GIT_AUTHOR_DATE=2020-01-01T00:00:00Z "
    "GIT_COMMITTER_NAME=sao GIT_COMMITTER_EMAIL=sao@localhost GIT_COMMITTER_DATE=2020-01-01T00:00:00Z"
)
# Where other packages keep vendored copies (pip/_vendor, urllib3/packages, setuptools/extern, site-packages).
VENDOR_DIRS = ("_vendor", "vendor", "extern", "_extern", "packages", "site-packages", "dist-packages")
NOT_MODULES = ("setup", "conftest", "noxfile", "fabfile", "tasks")
GIT_EXCLUDES = ["__pycache__/", "*.pyc", ".pytest_cache/", ".hypothesis/", "build/", "dist/", ".eggs/"]
IMAGE_RECIPE_VERSION = "4"


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


def _fresh_repo(message: str) -> str:
    """Shell that makes ``/testbed``'s repository anew from its working tree: one commit, no reflog."""
    excludes = "\\n".join(GIT_EXCLUDES)
    return (
        f"rm -rf .git && git init -q -b main . && printf '{excludes}\\n' >> .git/info/exclude "
        f"&& git add -A && {GIT_ENV} git commit -q -m '{message}' && rm -rf .git/logs"
    )


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def is_own_archive(filename: str, spec: SdistSpec) -> bool:
    """Whether ``filename`` (a wheel or sdist) is a distribution of the package ``spec`` itself."""
    return _norm(filename.split("-")[0]) == _norm(spec.name)


def top_level_modules(paths: list[str]) -> list[str]:
    """Import names a source tree defines (its packages and modules at the root, or under ``src/``), from the
    tree's relative file paths."""
    parts = [p.split("/") for p in paths]
    if any(len(q) > 2 and q[0] == "src" and q[-1] == "__init__.py" for q in parts):
        parts = [q[1:] for q in parts if q[0] == "src"]
    names = set()
    for q in parts:
        if len(q) == 2 and q[1] == "__init__.py" and q[0].isidentifier():
            names.add(q[0])
        elif len(q) == 1 and q[0].endswith(".py"):
            stem = q[0][:-3]
            if stem.isidentifier() and stem not in NOT_MODULES and "test" not in stem:
                names.add(stem)
    return sorted(names)


def sdist_modules(sdist: Path) -> list[str]:
    """``top_level_modules`` of an sdist archive (paths below its one top-level folder)."""
    with tarfile.open(sdist) as tf:
        return top_level_modules([m.name.split("/", 1)[1] for m in tf.getmembers() if m.isfile() and "/" in m.name])


def _scrub_copies(spec: SdistSpec, modules: list[str]) -> str:
    """Shell deleting, outside /testbed, the package's archives anywhere, copies of its modules vendored by other
    packages (pip vendors six, setuptools more-itertools, ...) with their bytecode, and the bundled pip/setuptools
    wheels that hold them."""
    names = {spec.name, _norm(spec.name), spec.name.replace("-", "_")}
    archive = " -o ".join(f"-iname '{n}-*.{ext}'" for n in sorted(names) for ext in ("whl", "tar.gz", "zip", "egg"))
    # With their bytecode: a vendored module's stale .pyc holds the fixed code as much as its source did.
    module = " -o ".join(f"-name '{m}' -o -name '{m}.py' -o -name '{m}.*.pyc' -o -name '{m}.pyc'" for m in modules)
    module = module or "-false"
    where = " -o ".join(f"-path '*/{d}/*'" for d in VENDOR_DIRS)
    return (
        f"find / -xdev -path /testbed -prune -o -type f \\( {archive} \\) -print0 | xargs -0 -r rm -f "
        f"&& find / -xdev -path /testbed -prune -o \\( {module} \\) \\( {where} \\) -print0 | xargs -0 -r rm -rf "
        "&& rm -rf /usr/share/python-wheels"
    )


def _repo_dockerfile(base_image: str, test_deps: list[str], spec: SdistSpec, modules: list[str]) -> str:
    # The package first (editable: /testbed is the only copy), then the test deps, which then find it installed.
    return f"""FROM {base_image}
COPY wheels /wheels
COPY src /testbed
WORKDIR /testbed
ENV PATH=/opt/venv/bin:$PATH PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python3 -m venv /opt/venv \\
 && PIP_FIND_LINKS=/wheels PIP_NO_CACHE_DIR=1 pip install -q -e . \\
 && PIP_FIND_LINKS=/wheels PIP_NO_CACHE_DIR=1 pip install -q {" ".join(f"'{d}'" for d in test_deps)} \\
 && rm -rf /wheels /root/.cache/pip /tmp/* \\
 && {_scrub_copies(spec, modules)} \\
 && git config --global user.name sao && git config --global user.email sao@localhost \\
 && git config --global --add safe.directory '*' \\
 && {_fresh_repo(f"Import {spec.name} {spec.version} from its sdist")}
STOPSIGNAL SIGKILL
CMD ["sleep", "infinity"]
"""


def repo_image_tag(spec: SdistSpec, sdist: Path, wheels: Path, base_image: str, test_deps: list[str]) -> str:
    h = hashlib.sha256()
    h.update(IMAGE_RECIPE_VERSION.encode())
    h.update(hashlib.sha256(sdist.read_bytes()).digest())
    for w in sorted(wheels.glob("*.whl")):
        if not is_own_archive(w.name, spec):
            h.update(w.name.encode())
    h.update(_repo_dockerfile(base_image, test_deps, spec, sdist_modules(sdist)).encode())
    return f"sao-swe-{spec.slug}:{spec.version}-{h.hexdigest()[:12]}"


def ensure_repo_image(spec: SdistSpec, sdist: Path, wheels: Path, base_image: str, test_deps: list[str]) -> str:
    """Build (once) the image holding the pristine package at /testbed with its test deps installed."""
    tag = repo_image_tag(spec, sdist, wheels, base_image, test_deps)
    if image_exists(tag):
        return tag
    with tempfile.TemporaryDirectory(prefix="sao-swe-ctx-") as tmp:
        ctx = Path(tmp)
        # Never the package's own wheel: it would hold the original source (it is installed from /testbed).
        own = [w.name for w in wheels.iterdir() if w.name == ".complete" or is_own_archive(w.name, spec)]
        shutil.copytree(wheels, ctx / "wheels", ignore=shutil.ignore_patterns(*own))
        with tarfile.open(sdist) as tf:
            tf.extractall(ctx / "unpacked", filter="data")
        tops = [p for p in (ctx / "unpacked").iterdir() if p.is_dir()]
        if len(tops) != 1:
            raise ImageBuildError(f"{sdist.name} does not unpack to one top-level folder; cannot use it as a repo")
        tops[0].rename(ctx / "src")
        (ctx / "Dockerfile").write_text(_repo_dockerfile(base_image, test_deps, spec, sdist_modules(sdist)))
        _docker_build(ctx, tag, f"the repo image of {spec}")
    return tag


def task_image_tag(repo_image: str, fix_patch: str) -> str:
    h = hashlib.sha256(f"{IMAGE_RECIPE_VERSION}\n{repo_image}\n{fix_patch}".encode()).hexdigest()[:12]
    repo, _, version = repo_image.rpartition(":")
    return f"{repo}:{version.split('-')[0]}-bug-{h}"


def ensure_task_image(repo_image: str, fix_patch: str, message: str = "Current state") -> str:
    """Build (once) ``repo_image`` with the bug injected (``fix_patch`` applied in reverse) and its repository
    made anew from the buggy tree, so the fixed files exist nowhere in the container (see the module docstring)."""
    tag = task_image_tag(repo_image, fix_patch)
    if image_exists(tag):
        return tag
    dockerfile = f"""FROM {repo_image}
COPY fix.diff /tmp/fix.diff
RUN cd /testbed && git apply -R /tmp/fix.diff && rm /tmp/fix.diff \\
 && {_fresh_repo(message)}
"""
    with tempfile.TemporaryDirectory(prefix="sao-swe-task-") as tmp:
        (Path(tmp) / "Dockerfile").write_text(dockerfile)
        (Path(tmp) / "fix.diff").write_text(fix_patch)
        _docker_build(Path(tmp), tag, "a task image")
    return tag
