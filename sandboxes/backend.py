"""``make_sandbox(cfg)``: one sandbox of the backend ``cfg.backend`` names, no pool. One layer under
``factory.py`` (its direct provider) and ``pool.py`` (cold starts); ``sandboxes.factory`` still exports it."""

from __future__ import annotations

from sandboxes.config import SandboxConfig
from sandboxes.protocols import Sandbox


async def make_sandbox(cfg: SandboxConfig) -> Sandbox:
    """Start one sandbox for ``cfg`` (no pool); close it with ``await sb.close()`` or ``async with``."""
    if cfg.backend == "docker":
        from sandboxes.docker import DockerSandbox

        return await DockerSandbox.create(cfg)
    from sandboxes.bwrap import BwrapSandbox

    return await BwrapSandbox.create(cfg)


__all__ = ["make_sandbox"]
