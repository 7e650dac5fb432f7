"""The setup steps a warm cache skips, run from empty: CI's machine keeps ~/.cache/sao between runs, so without these
tests the one path every new user takes (model conversion, DeepSpeed's op build) would never run in CI. Each step runs
as `python -m sao.core.setup STEP` with SAO_CACHE and TORCH_EXTENSIONS_DIR pointed at an empty folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _setup_step(step: str, cache: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SAO_CACHE=str(cache), TORCH_EXTENSIONS_DIR=str(cache / "torch_extensions"))
    return subprocess.run(
        [sys.executable, "-m", "sao.core.setup", step], capture_output=True, text=True, timeout=timeout, env=env
    )


def test_model_step_converts_smollm2_into_an_empty_cache(tmp_path: Path, smollm2_dir: Path) -> None:
    """Download (pip's own cache may serve it) and convert the GGUF: the step that failed on transformers 5 without
    accelerate. The result must be the model the rest of the suite uses, tensor for tensor."""
    from safetensors.torch import load_file

    res = _setup_step("model", tmp_path, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "converting SmolLM2" in res.stderr, "the step was skipped: the cache was not empty"
    made = tmp_path / "models" / smollm2_dir.name
    assert (made / "tokenizer.json").is_file() and (made / "config.json").is_file()
    new, ref = load_file(made / "model.safetensors"), load_file(smollm2_dir / "model.safetensors")
    assert new.keys() == ref.keys()
    differ = [k for k in ref if not (new[k].dtype == ref[k].dtype and new[k].equal(ref[k]))]
    assert not differ, f"the fresh conversion differs from the cached model in {differ[:5]}"


def test_deepspeed_ops_build_into_an_empty_cache(tmp_path: Path) -> None:
    res = _setup_step("ds-ops", tmp_path, timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "building DeepSpeed ops" in res.stderr, "the step was skipped: the cache was not empty"
    built = {p.name for p in (tmp_path / "torch_extensions").rglob("*.so")}
    assert any("shm" in n for n in built), f"no shared-memory comm op was built: {sorted(built)}"
    assert (tmp_path / "torch_extensions" / ".sao-built").is_file()
