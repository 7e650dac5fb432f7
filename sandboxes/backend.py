"""``make_sandbox(cfg)``: one sandbox of the backend ``cfg.backend`` names, no pool. One layer under
``factory.py`` (its direct provider) and ``pool.py`` (cold starts); ``sao.sandboxes.factory`` still exports it."""

from __future__ import annotations

from sao.sandboxes.config import SandboxConfig
from sao.sandboxes.protocols import Sandbox


async def make_sandbox(cfg: SandboxConfig) -> Sandbox:
    """Start one sandbox for ``cfg`` (no pool); close it with ``await sb.close()`` or ``async with``."""
    if cfg.backend == "docker":
        from sao.sandboxes.docker import DockerSandbox

        return await DockerSandbox.create(cfg)
    from sao.sandboxes.bwrap import BwrapSandbox

    return await BwrapSandbox.create(cfg)


def check_backend(cfg: SandboxConfig) -> None:
    """Raise ``SandboxUnavailableError`` (saying how to fix it) unless ``cfg.backend`` answers now: the Docker daemon
    replies, or the bwrap binary is installed. Blocking; a run calls it once before its first episode."""
    if cfg.backend == "docker":
        from sao.sandboxes.docker import get_client

        get_client(cfg.docker_host)
    else:
        from sao.sandboxes.bwrap import bwrap_path

        bwrap_path()


__all__ = ["check_backend", "make_sandbox"]
