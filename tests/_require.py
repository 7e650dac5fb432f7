"""``require``: a missing prerequisite fails the test in CI (CI=true) and skips it, with the reason, elsewhere."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing(what: str, fix: str) -> NoReturn:
    """Stop the test because ``what`` is unavailable; ``fix`` says how to get it."""
    msg = f"{what} is not available: {fix}"
    if in_ci():
        pytest.fail(f"CI needs it: {msg}", pytrace=False)
    pytest.skip(msg)
