"""Where SAO keeps things that outlive a clone: the cache folder and the assets inside it."""

from __future__ import annotations

import os
from pathlib import Path

SMOLLM2_DIRNAME = "SmolLM2-135M-Instruct"


def cache_dir() -> Path:
    """The cache folder (``$SAO_CACHE``, default ``~/.cache/sao``), created on first use."""
    root = Path(os.environ.get("SAO_CACHE") or Path.home() / ".cache" / "sao").expanduser()
    root.mkdir(parents=True, exist_ok=True)
    return root


def smollm2_dir() -> Path:
    """The converted SmolLM2-135M-Instruct safetensors directory (made by ``scripts/setup.sh``)."""
    return cache_dir() / "models" / SMOLLM2_DIRNAME


def torch_extensions_dir() -> Path:
    """DeepSpeed's JIT op cache, kept in the cache folder so ops are compiled once per machine."""
    return cache_dir() / "torch_extensions"


def shared_data_dir() -> Path | None:
    """The benchmark data folder (``$SAO_DATA`` or ``../shared/data`` beside the clone), if present."""
    env = os.environ.get("SAO_DATA")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent.parent
    for cand in (here.parent / "shared" / "data", here / "data"):
        if cand.is_dir():
            return cand
    return None
