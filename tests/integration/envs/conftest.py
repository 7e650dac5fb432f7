"""Fixtures of the env integration tests: a working bubblewrap (or a skip naming what is missing)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests._require import missing


@pytest.fixture(scope="module")
def bwrap_ok() -> None:
    if shutil.which("bwrap") is None:
        missing("bubblewrap", "run `apt-get install bubblewrap`")
    probe = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--unshare-all", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        missing("a working bubblewrap", f"bwrap cannot create namespaces here: {probe.stderr.strip()}")
