"""The offline base image as a sandbox error: one layer under ``docker.py`` (a sandbox without an image starts
from it) and ``images.py`` (task images are built on it), which both import it from here."""

from __future__ import annotations

from sao.sandboxes.protocols import ImageNotFoundError


def ensure_base_image() -> str:
    """The tag of the offline base image, importing it from the cached tarball (or building it with debootstrap,
    ~2 min, first time only) when the daemon lacks it. Raises ``ImageNotFoundError`` when that cannot work."""
    from sao.core.setup import SetupError
    from sao.core.setup import ensure_base_image as setup_base

    try:
        return setup_base()
    except SetupError as e:
        raise ImageNotFoundError(f"the offline base image is unavailable: {e}") from e


__all__ = ["ensure_base_image"]
