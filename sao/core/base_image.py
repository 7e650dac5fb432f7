"""What the offline base image is: its recipe and the tag that names it. ``python -m sao.core.setup image`` makes it
(the only code that installs); runtime code only looks the tag up and, when the Docker host lacks it, names that
command (``sao.sandboxes.base_image``)."""

from __future__ import annotations

import hashlib

BASE_IMAGE_NAME = "sao-base"
# The recipe of the offline base image; its hash names the tarball and the tag, so a change rebuilds it.
BASE_PACKAGES = "python3,python3-venv,python3-pip,git,ca-certificates,patch,procps"
BASE_SUITE = "bookworm"
# Applied by a two-line `docker build` on top of the imported rootfs (`docker import --change` refuses STOPSIGNAL).
BASE_DOCKERFILE_TAIL = ("STOPSIGNAL SIGKILL", 'CMD ["sleep", "infinity"]', "ENV LANG=C.UTF-8", "WORKDIR /")
SETUP_IMAGE_COMMAND = "python -m sao.core.setup image"


def base_image_recipe_hash() -> str:
    recipe = "|".join([BASE_SUITE, "minbase", BASE_PACKAGES, *BASE_DOCKERFILE_TAIL])
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def base_image_tag() -> str:
    """The tag of the offline base image for the current recipe, e.g. ``sao-base:3f2a...``."""
    return f"{BASE_IMAGE_NAME}:{base_image_recipe_hash()}"
