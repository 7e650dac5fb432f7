"""A vLLM worker extension (mixed into each vLLM worker) that reloads weights in place from a safetensors checkpoint.

Loaded with ``--worker-extension-cls agent.engines.vllm_worker_ext.SAOWorkerExtension`` and called over the dev
``POST /collective_rpc`` endpoint (``VLLM_SERVER_DEV_MODE=1``). Method names carry a ``sao_`` prefix because
vLLM refuses an extension whose names clash with the worker's.

Why not ``model.load_weights`` or the built-in reload: on CPU, vLLM repacks linear weights at load time
(the plain parameters are emptied), so loading into them fails; and its ``reload_weights`` leaves a tied
``lm_head`` pointing at the old embedding tensor. This extension runs the layerwise in-place reload and then
re-ties the head and rebuilds the head's packed copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any


def iter_safetensors(checkpoint_dir: str) -> Iterator[tuple[str, Any]]:
    """(name, tensor) for every tensor of every ``*.safetensors`` file in ``checkpoint_dir``."""
    from safetensors import safe_open

    files = sorted(Path(checkpoint_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {checkpoint_dir}")
    for f in files:
        with safe_open(str(f), framework="pt", device="cpu") as st:
            for name in st.keys():  # noqa: SIM118 - safe_open objects are not iterable
                yield name, st.get_tensor(name)


class SAOWorkerExtension:
    """Mixed into vLLM's worker class: ``self`` is the worker and has ``model_runner``."""

    model_runner: Any

    def sao_reload_weights(self, checkpoint_dir: str) -> dict[str, float]:
        """Load every tensor of ``checkpoint_dir`` into the running model; return a small fingerprint."""
        import time

        t0 = time.perf_counter()
        self.model_runner.reload_weights(weights_iterator=iter_safetensors(checkpoint_dir))
        self._sao_retie_lm_head()
        return {"seconds": time.perf_counter() - t0, **self.sao_fingerprint()}

    def _sao_retie_lm_head(self) -> None:
        model = self.model_runner.get_model()
        config = getattr(model, "config", None)
        head = getattr(model, "lm_head", None)
        inner = getattr(model, "model", None)
        embed = getattr(inner, "embed_tokens", None)
        if not (config is not None and getattr(config, "tie_word_embeddings", False) and head and embed):
            return
        head.weight = embed.weight
        method = getattr(head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            # On CPU this rebuilds the packed/oneDNN copy of the head from the (new) embedding.
            method.process_weights_after_loading(head)

    def sao_fingerprint(self) -> dict[str, float]:
        """Sum of the embedding table (cheap evidence of which weights are live)."""
        model = self.model_runner.get_model()
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        if embed is None:
            return {}
        return {"embed_sum": float(embed.weight.double().sum())}
