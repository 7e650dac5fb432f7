"""One entry point from config to sandboxes: ``make_sandbox(cfg)`` and ``make_provider(cfg, pool)``.

``sandbox.backend`` picks the implementation: ``docker`` (``DockerSandbox``, pooled by ``WarmPool``) or
``bwrap`` (``BwrapSandbox``, nothing to pool: a jail costs ~10 ms). Envs should hold one provider per image and
call ``acquire()`` / ``lease()`` per episode.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from sao.core.config import build
from sao.sandboxes.backend import make_sandbox
from sao.sandboxes.config import PoolConfig, SandboxConfig
from sao.sandboxes.protocols import Sandbox


def sandbox_config_from_dict(data: Mapping[str, Any]) -> SandboxConfig:
    """``SandboxConfig`` from a YAML mapping (``sao.core.config.build``): a wrong type or an unknown key is a
    ``ConfigError`` (a ValueError) naming it and the nearest valid key."""
    return build(SandboxConfig, data, prefix="sandbox")


class SandboxProvider(Protocol):
    """Hands out fresh sandboxes of one configuration; ``aclose`` releases whatever it keeps."""

    async def acquire(self) -> Sandbox: ...

    def lease(self) -> contextlib.AbstractAsyncContextManager[Sandbox]: ...

    async def aclose(self) -> None: ...


class DirectProvider:
    """A provider that creates each sandbox on demand (bwrap, or Docker without warm containers)."""

    def __init__(self, cfg: SandboxConfig) -> None:
        self.cfg = cfg

    async def acquire(self) -> Sandbox:
        return await make_sandbox(self.cfg)

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[Sandbox]:
        sb = await self.acquire()
        try:
            yield sb
        finally:
            await sb.close()

    async def aclose(self) -> None:
        return None


async def make_provider(cfg: SandboxConfig, pool: PoolConfig | None = None) -> SandboxProvider:
    """A started ``WarmPool`` for Docker (``pool`` sizes), a ``DirectProvider`` for bwrap."""
    if cfg.backend == "docker":
        from sao.sandboxes.pool import WarmPool

        return await WarmPool(cfg, pool).start()
    return DirectProvider(cfg)


__all__ = [
    "DirectProvider",
    "PoolConfig",
    "SandboxConfig",
    "SandboxProvider",
    "make_provider",
    "make_sandbox",
    "sandbox_config_from_dict",
]
