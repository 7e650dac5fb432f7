"""The offline base image as runtime code sees it: its tag, and the error that names the setup step making it when
the Docker host lacks it. Nothing here builds or imports an image (``python -m sao.core.setup image`` does). One
layer under ``docker.py`` (a sandbox without an image starts from it) and ``images.py`` (task images build on it)."""

from __future__ import annotations

from sao.core.base_image import BASE_IMAGE_NAME, SETUP_IMAGE_COMMAND, base_image_tag
from sao.sandboxes.protocols import ImageNotFoundError


def missing_image(tag: str) -> ImageNotFoundError:
    """The error for an image the Docker host lacks: the base image names its setup step, others how to build one."""
    if tag.split(":")[0] == BASE_IMAGE_NAME:
        return ImageNotFoundError(
            f"the offline base image {tag!r} is not on the Docker host; make it with `{SETUP_IMAGE_COMMAND}` "
            "(`bash scripts/setup.sh` runs every setup step)"
        )
    return ImageNotFoundError(
        f"image {tag!r} is not on the Docker host; build it with sao.sandboxes.images.build_task_image, or for "
        "offline SWE tasks with `sao tasks build`"
    )


__all__ = ["base_image_tag", "missing_image"]
