"""Fixtures for the sandbox integration tests: a config on the base image and a no-leftover check per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from sao.sandboxes.config import SandboxConfig


def owned_containers(client: Any) -> set[str]:
    """Ids of every container (running or not) labelled with this test process as owner."""
    return {c["Id"] for c in client.api.containers(all=True, filters={"label": f"sao.owner_pid={os.getpid()}"})}


@pytest.fixture()
def docker_cfg(base_image: str) -> SandboxConfig:
    return SandboxConfig(image=base_image, mem_limit="256m", cpus=1.0, pids_limit=64, kill_grace_s=3.0)


@pytest.fixture()
def no_leftovers(docker_client: Any) -> Iterator[None]:
    """Fails the test if it leaves a container of ours behind (and removes it)."""
    before = owned_containers(docker_client)
    yield
    left = owned_containers(docker_client) - before
    for cid in left:
        docker_client.api.remove_container(cid, force=True)
    assert not left, f"{len(left)} container(s) left behind: {sorted(c[:12] for c in left)}"
