"""Download a PyPI sdist and the wheels its tests and build need, into the cache, for offline image builds."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from sao.core.jsonl import write_text_durably
from sao.core.paths import cache_dir

# Extra test requirements of packages whose suites need more than pytest (the builder cannot read them reliably
# from the sdist: they live in tox files, requirement folders or dependency groups).
KNOWN_TEST_DEPS: dict[str, list[str]] = {
    "idna": ["hypothesis"],
    "attrs": ["hypothesis", "pympler"],
    "python-dateutil": ["hypothesis", "freezegun"],
}
ALWAYS_TEST_DEPS = ["pytest"]
# pip's fallback build requirements for sdists without a [build-system] table.
DEFAULT_BUILD_DEPS = ["setuptools", "wheel"]
TARGET_PLATFORMS = ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64", "linux_x86_64"]
_SPEC_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)$")


class FetchError(RuntimeError):
    """A download failed; the message names the package and the fix."""


@dataclass(frozen=True)
class SdistSpec:
    """A pinned PyPI release: ``name==version``."""

    name: str
    version: str

    @classmethod
    def parse(cls, text: str) -> SdistSpec:
        m = _SPEC_RE.match(text.strip())
        if not m:
            raise ValueError(f"sdist spec {text!r} is not of the form name==version (e.g. click==8.5.1)")
        return cls(m.group(1).lower().replace("_", "-"), m.group(2))

    @property
    def slug(self) -> str:
        """A name safe for image tags and instance ids."""
        return re.sub(r"[^a-z0-9-]", "-", self.name.lower())

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"


def swe_cache() -> Path:
    root = cache_dir() / "swe"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _pip(args: list[str], what: str, timeout: float = 600) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise FetchError(f"downloading {what} timed out after {timeout:.0f}s; check access to the package index") from e
    if proc.returncode != 0:
        raise FetchError(
            f"`pip download` of {what} failed (exit {proc.returncode}); check the name/version and access to "
            f"the package index:\n{(proc.stderr or proc.stdout)[-1500:]}"
        )


def fetch_sdist(spec: SdistSpec) -> Path:
    """The sdist archive of ``spec`` in the cache (downloaded once)."""
    dest = swe_cache() / "dists"
    dest.mkdir(parents=True, exist_ok=True)
    found = _find_sdist(dest, spec)
    if found is None:
        _pip(["--no-deps", "--no-binary", ":all:", "-d", str(dest), str(spec)], f"the sdist {spec}")
        found = _find_sdist(dest, spec)
    if found is None:
        raise FetchError(f"{spec} has no sdist (.tar.gz) on the index; pick a release that publishes one")
    return found


def _find_sdist(folder: Path, spec: SdistSpec) -> Path | None:
    norm = re.sub(r"[-_.]+", "_", spec.name)
    for p in sorted(folder.glob("*.tar.gz")):
        stem = re.sub(r"[-_.]+", "_", p.name[: -len(".tar.gz")].lower())
        if stem == f"{norm}_{re.sub(r'[-_.]+', '_', spec.version)}":
            return p
    return None


def build_requirements(sdist: Path) -> list[str]:
    """``[build-system].requires`` of the sdist (pip's defaults when it has none)."""
    with tarfile.open(sdist) as tf:
        tops = (m for m in tf.getmembers() if m.name.count("/") == 1 and m.name.endswith("/pyproject.toml"))
        member = next(tops, None)
        if member is None:
            return list(DEFAULT_BUILD_DEPS)
        f = tf.extractfile(member)
        data = tomllib.loads(f.read().decode()) if f else {}
    reqs = data.get("build-system", {}).get("requires")
    return [str(r) for r in reqs] if reqs else list(DEFAULT_BUILD_DEPS)


def fetch_wheels(spec: SdistSpec, sdist: Path, extra_test_deps: list[str] | None = None) -> Path:
    """A folder of cp311 linux wheels: the package's runtime deps, its test deps and its build backend."""
    dest = swe_cache() / "wheels" / f"{spec.slug}-{spec.version}"
    stamp = dest / ".complete"
    if stamp.exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    test_deps = [*ALWAYS_TEST_DEPS, *KNOWN_TEST_DEPS.get(spec.name, []), *(extra_test_deps or [])]
    # The package's own runtime deps come from the sdist metadata: resolve them as wheels for the image.
    reqs = [*test_deps, *build_requirements(sdist), *DEFAULT_BUILD_DEPS]
    target = ["--only-binary", ":all:", "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311"]
    for plat in TARGET_PLATFORMS:
        target += ["--platform", plat]
    _pip([*target, "-d", str(dest), *reqs], f"the test/build wheels of {spec} ({', '.join(reqs)})")
    _pip([*target, "-d", str(dest), str(spec)], f"the runtime dependencies of {spec}")
    write_text_durably(stamp, "\n".join(reqs) + "\n")
    return dest
