"""Session fixture: the small offline SWE task set (2 bugs each from six and toolz), built once and cached."""

from __future__ import annotations

from typing import Any

import pytest

from tests._require import missing


@pytest.fixture(scope="session")
def offline_tasks(base_image: str) -> list[dict[str, Any]]:
    """Validated SWE-bench-format records whose images exist on the Docker host (cold: ~2-3 min; warm: seconds)."""
    from sao.envs.swe.tasks import ensure_offline_tasks
    from sao.envs.swe.tasks.fetch import FetchError

    try:
        return ensure_offline_tasks(n_per_package=2)
    except FetchError as e:
        missing("the sdists/wheels of the offline SWE tasks", f"{e}; run once with access to the package index")
