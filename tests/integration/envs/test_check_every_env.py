"""Gymnasium's ``check_env`` over EVERY registered ``sao/`` env id, listed at collection time: a newly registered
env is checked without editing this file. Ids that cannot be made from their defaults get their setup from
``SETUP`` (today only the SWE env: an offline task and Docker)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sao.envs.checking import check_envs
from sao.envs.registration import list_envs

pytestmark = pytest.mark.timeout(600)


def _swe_kwargs(request: pytest.FixtureRequest) -> dict[str, Any]:
    from sao.envs.swe.tasks import ensure_offline_tasks
    from sao.envs.swe.tasks.fetch import FetchError
    from tests._require import missing

    request.getfixturevalue("base_image")  # Docker and the offline base image
    try:
        tasks = ensure_offline_tasks(n_per_package=2)
    except FetchError as e:
        missing("the sdists/wheels of the offline SWE tasks", f"{e}; run once with access to the package index")
    return {"tasks": tasks[:1], "max_steps": 3}


#: env id -> (kwargs maker, extra marks). Everything else is made with its registered defaults.
SETUP: dict[str, tuple[Callable[[pytest.FixtureRequest], dict[str, Any]], list[pytest.MarkDecorator]]] = {
    "sao/SWE-v0": (_swe_kwargs, [pytest.mark.docker, pytest.mark.slow]),
}


def _params() -> list[Any]:
    ids = [env_id for env_id, _ in list_envs()]
    assert ids, "no sao/ env is registered"
    return [pytest.param(i, marks=SETUP[i][1] if i in SETUP else [], id=i) for i in ids]


@pytest.mark.parametrize("env_id", _params())
def test_check_env(env_id: str, request: pytest.FixtureRequest) -> None:
    kwargs = SETUP[env_id][0](request) if env_id in SETUP else {}
    [result] = check_envs([env_id], kwargs)
    assert result.status == "ok", f"{env_id}: {result.message}"


def test_the_builtin_envs_are_all_listed() -> None:
    # Guards the parametrization above against an empty or partial registry.
    ids = {i for i, _ in list_envs()}
    assert {"sao/PythonTool-v0", "sao/OnlineWriting-v0", "sao/TokenGame-v0", "sao/SWE-v0"} <= ids
