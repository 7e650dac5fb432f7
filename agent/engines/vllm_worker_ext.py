"""A vLLM worker extension (mixed into each vLLM worker) that reloads weights in place: from a safetensors
checkpoint, or received in memory from the trainer over a process group (``sao.agent.engines.weight_sync``).

Loaded with ``--worker-extension-cls sao.agent.engines.vllm_worker_ext.SAOWorkerExtension`` and called over the dev
``POST /collective_rpc`` endpoint (``VLLM_SERVER_DEV_MODE=1``). Method names carry a ``sao_`` prefix because
vLLM refuses an extension whose names clash with the worker's.

Why not ``model.load_weights`` or the built-in reload: on CPU, vLLM repacks linear weights at load time
(the plain parameters are emptied), so loading into them fails; and its ``reload_weights`` leaves a tied
``lm_head`` pointing at the old embedding tensor. This extension runs the layerwise in-place reload and then
re-ties the head and rebuilds the head's packed copy.

Each worker remembers the policy version it serves (``sao_version``); both reload paths set it.
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
    _sao_served_version: int = 0

    def sao_reload_weights(self, checkpoint_dir: str, version: int | None = None) -> dict[str, float]:
        """Load every tensor of ``checkpoint_dir`` into the running model; return a small fingerprint."""
        import time

        t0 = time.perf_counter()
        self.model_runner.reload_weights(weights_iterator=iter_safetensors(checkpoint_dir))
        self._sao_retie_lm_head()
        if version is not None:
            self._sao_served_version = int(version)
        return {"seconds": time.perf_counter() - t0, "version": self._sao_served_version, **self.sao_fingerprint()}

    def sao_receive_weights(self, plan: str | dict[str, Any], rank_offset: int = 1) -> dict[str, float]:
        """Join the trainer's weight-sync group, receive every tensor of ``plan``, load them, serve its version.

        ``plan`` is ``SyncPlan.to_dict()``, or its JSON (the dev RPC endpoint passes arguments as strings).
        ``rank_offset`` is this server's first rank in the group; a tensor-parallel worker adds its own rank.
        """
        import json
        import time

        import torch

        from sao.agent.engines.weight_sync import SyncPlan, destroy_group, init_group, receive

        t0 = time.perf_counter()
        p = SyncPlan.from_dict(json.loads(plan) if isinstance(plan, str) else plan)
        rank = int(rank_offset) + int(getattr(self, "rank", 0) or 0)
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        pg = init_group(p, rank)
        try:
            tensors = receive(pg, p, device)
        finally:
            destroy_group(pg)
        t1 = time.perf_counter()
        self.model_runner.reload_weights(weights_iterator=iter(tensors))
        self._sao_retie_lm_head()
        self._sao_served_version = p.version
        return {
            "seconds": time.perf_counter() - t0,
            "receive_s": t1 - t0,
            "load_s": time.perf_counter() - t1,
            "version": p.version,
            **self.sao_fingerprint(),
        }

    def sao_version(self) -> int:
        """The policy version this worker's weights come from."""
        return self._sao_served_version

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
