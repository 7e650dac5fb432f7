"""SWEEnv rejects bad task records and configs before touching Docker."""

from __future__ import annotations

import pytest

from sao.envs.swe.env import SWEEnv


def test_malformed_record_is_a_value_error() -> None:
    env = SWEEnv()
    try:
        with pytest.raises(ValueError, match=r"lacks field\(s\).*FAIL_TO_PASS"):
            env.reset(options={"task": {"instance_id": "x", "image": "y"}})
    finally:
        env.close()


def test_no_tasks_and_no_task_option_says_what_to_pass() -> None:
    env = SWEEnv()
    try:
        with pytest.raises(ValueError, match="no task list"):
            env.reset(seed=0)
    finally:
        env.close()


def test_non_docker_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="backend='docker'"):
        SWEEnv(sandbox={"backend": "bwrap"})
