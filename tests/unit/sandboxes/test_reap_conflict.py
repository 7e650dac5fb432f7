"""reap_orphans on a daemon shared by several processes (two simulated Ray nodes, or two runs on one host): a
container another reaper is already removing answers 409, which is not an error; any other API error still is."""

from __future__ import annotations

import socket
import subprocess
import sys
from typing import Any

import docker
import pytest
import requests

import sao.sandboxes.docker as sdocker


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


class _Api:
    def __init__(self, statuses: dict[str, int]) -> None:
        self.statuses = statuses
        self.pid = _dead_pid()

    def containers(self, all: bool, filters: dict[str, str]) -> list[dict[str, Any]]:
        labels = {"sao.owner": "sao", "sao.owner_host": socket.gethostname(), "sao.owner_pid": str(self.pid)}
        return [{"Id": cid, "Labels": labels} for cid in self.statuses]

    def remove_container(self, cid: str, force: bool, v: bool) -> None:
        status = self.statuses[cid]
        if status == 404:
            raise docker.errors.NotFound("gone")
        if status != 204:
            resp = requests.Response()
            resp.status_code = status
            raise docker.errors.APIError("removal failed", response=resp)


class _Client:
    def __init__(self, statuses: dict[str, int]) -> None:
        self.api = _Api(statuses)


def test_a_removal_already_in_progress_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    client = _Client({"a": 409, "b": 204, "c": 404})
    monkeypatch.setattr(sdocker, "get_client", lambda host=None: client)
    assert sdocker.reap_orphans() == ["b"]


def test_other_api_errors_still_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    client = _Client({"a": 500})
    monkeypatch.setattr(sdocker, "get_client", lambda host=None: client)
    with pytest.raises(docker.errors.APIError):
        sdocker.reap_orphans()


class _RestartingApi:
    """A daemon that goes away right after starting the first container (a restart), then answers again."""

    def __init__(self) -> None:
        self.inspects = 0
        self.removed: list[str] = []

    def create_host_config(self, *a: Any, **kw: Any) -> dict[str, Any]:
        return kw

    def create_container(self, *a: Any, **kw: Any) -> dict[str, str]:
        return {"Id": f"c{self.inspects}"}

    def start(self, cid: str) -> None:
        pass

    def inspect_container(self, cid: str) -> dict[str, Any]:
        self.inspects += 1
        if self.inspects == 1:
            raise requests.exceptions.ConnectionError("connection refused")
        return {"Config": {"WorkingDir": "/work"}}

    def remove_container(self, cid: str, force: bool, v: bool = False) -> None:
        self.removed.append(cid)


def test_a_daemon_lost_between_start_and_preparation_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """It used to reach the episode as a raw ConnectionError at once (no wait through the restart)."""
    from sao.sandboxes.config import SandboxConfig

    api = _RestartingApi()
    client = type("C", (), {"api": api})()
    monkeypatch.setattr(sdocker, "get_client", lambda host=None: client)
    monkeypatch.setattr(sdocker.DockerSandbox, "_prepare_blocking", lambda self: None)
    monkeypatch.setattr(
        sdocker._DiskWatch, "of", staticmethod(lambda c, h: type("W", (), {"add": lambda s, b: None})())
    )
    monkeypatch.setattr(sdocker.time, "sleep", lambda s: None)
    monkeypatch.setattr(sdocker, "_ANSWERED", {sdocker._host_key(None)})
    sb = sdocker.DockerSandbox.create_blocking(SandboxConfig(backend="docker", image="img", daemon_wait_s=30))
    assert api.inspects == 2 and api.removed == ["c0"] and sb.workdir == "/work"


@pytest.mark.parametrize(("answered", "wait_s", "waits"), [(True, 0.2, True), (True, 0, False), (False, 30, False)])
def test_a_daemon_is_waited_for_only_when_it_answered_before(
    monkeypatch: pytest.MonkeyPatch, answered: bool, wait_s: float, waits: bool
) -> None:
    """Waited for up to ``daemon_wait_s`` (then the error says so); never when it never answered or the wait is 0."""
    from sao.sandboxes.config import SandboxConfig
    from sao.sandboxes.protocols import SandboxUnavailableError

    calls: list[int] = []

    def unreachable(cls: object, cfg: object, labels: object) -> None:
        calls.append(1)
        raise SandboxUnavailableError("Docker daemon unreachable")

    monkeypatch.setattr(sdocker.DockerSandbox, "_create_once", classmethod(unreachable))
    monkeypatch.setattr(sdocker.time, "sleep", lambda s: None)
    monkeypatch.setattr(sdocker, "_ANSWERED", {sdocker._host_key(None)} if answered else set())
    with pytest.raises(SandboxUnavailableError) as err:
        sdocker.DockerSandbox.create_blocking(SandboxConfig(backend="docker", image="img", daemon_wait_s=wait_s))
    assert ("for it to come back" in str(err.value)) == waits
    assert not waits or "waited 0.2 s" in str(err.value)
    assert (len(calls) > 1) == waits
