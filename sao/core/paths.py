"""Where SAO keeps things that outlive a clone (the cache folder and the assets inside it), and model aliases."""

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


#: Model names usable wherever a model is named (``model.path``, ``--model local:NAME``): name -> directory maker.
MODEL_ALIASES = {"smollm2": smollm2_dir}


def resolve_model_path(name: str) -> str:
    """A model alias (``smollm2``) -> its directory; anything else (a path, ``tiny:llama``) comes back expanded."""
    alias = MODEL_ALIASES.get(name.strip().lower())
    if alias is not None:
        return str(alias())
    return name if name.startswith("tiny:") else str(Path(name).expanduser())
