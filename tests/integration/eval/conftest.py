"""Session fixtures of the eval tests: the small offline SWE task set (six and toolz; cached as for swe tests)."""

from __future__ import annotations

from typing import Any

import pytest

from tests._require import missing


@pytest.fixture(scope="session")
def offline_records(base_image: str) -> list[dict[str, Any]]:
    """The cached offline set: 2 bugs each from six and toolz, their images on the Docker host."""
    from sao.envs.swe.tasks import ensure_offline_tasks
    from sao.envs.swe.tasks.fetch import FetchError

    try:
        return ensure_offline_tasks(n_per_package=2)
    except FetchError as e:
        missing("the sdists/wheels of the offline SWE tasks", f"{e}; run once with access to the package index")


@pytest.fixture(scope="session")
def eval_tasks(offline_records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One six task and one toolz task from the offline set."""
    firsts = {r["sao_mutation"]["sdist"]: r for r in reversed(offline_records)}
    return sorted(firsts.values(), key=lambda r: r["instance_id"])
