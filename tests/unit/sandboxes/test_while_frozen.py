"""`_while_frozen`: a call the daemon refuses because the disk watch froze the container is tried again; anything
else is raised as it came (pure logic: the refusals are docker-py's own APIError on a stand-in response)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import docker.errors
import pytest

from sao.sandboxes.docker import _while_frozen


def _refusal(status: int, text: str) -> docker.errors.APIError:
    # as docker-py raises it: the daemon's message is the explanation, the status that of the HTTP response
    response = SimpleNamespace(status_code=status, reason="Conflict", url="http+docker://localhost/exec")
    return docker.errors.APIError("HTTP error", response=response, explanation=text)


def test_a_paused_refusal_is_tried_again_until_the_call_goes_through() -> None:
    calls: list[int] = []

    def exec_create() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise _refusal(409, "Container abc is paused, unpause the container before exec")
        return "exec-id"

    assert _while_frozen(exec_create) == "exec-id" and len(calls) == 4


@pytest.mark.parametrize("status,text", [(409, "Conflict: container is not running"), (500, "server error paused")])
def test_any_other_error_is_raised_at_once(status: int, text: str) -> None:
    calls: list[int] = []

    def exec_create() -> Any:
        calls.append(1)
        raise _refusal(status, text)

    with pytest.raises(docker.errors.APIError):
        _while_frozen(exec_create)
    assert len(calls) == 1


def test_a_refusal_past_the_wait_is_raised_as_it_came() -> None:
    def exec_create() -> Any:
        raise _refusal(409, "container is paused")

    t0 = time.monotonic()
    with pytest.raises(docker.errors.APIError, match="paused"):
        _while_frozen(exec_create, wait_s=0.2)
    assert 0.2 <= time.monotonic() - t0 < 2
