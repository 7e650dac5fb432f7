"""The environment a test gives a ``sao`` subprocess: this checkout on the path, the op cache shared, and no
distributed variables of the test process (a child must start its own single-process world)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cli_env() -> dict[str, str]:
    from sao.core.paths import torch_extensions_dir

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(torch_extensions_dir()))
    env["PYTHONPATH"] = str(ROOT)
    return env
