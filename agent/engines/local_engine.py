"""LocalEngine (engine ``hf`` with ``rollout.action_vocab``): in-process sampling on a private copy of the actor,
with an optional restricted action vocabulary.

Why it exists beside the agent's HF engine: a random-init toy model samples from 49k tokens and would never emit
a valid answer; restricting sampling to a few token ids (``rollout.action_vocab``) makes toy runs learnable,
and the trainer applies the same restriction when it recomputes logprobs, so the sampling policy and the
trained policy stay the same distribution. Each ``generate`` runs in a worker thread (torch releases the GIL),
so episodes proceed while the trainer step runs in another thread.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sao.agent.engines.protocols import EngineError, Generation, SamplingParams


def restrict_logits(logits: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """Set every logit outside ``allowed`` (a 1-D tensor of token ids) to -inf; identity when ``allowed`` is None."""
    if allowed is None:
        return logits
    mask = torch.full((logits.shape[-1],), float("-inf"), dtype=logits.dtype, device=logits.device)
    mask[allowed.to(logits.device)] = 0.0
    return logits + mask


class LocalEngine:
    """Token-in/token-out sampling with a KV cache, batch 1 per call, on a copy of ``model``."""

    def __init__(self, model: nn.Module, allowed_token_ids: list[int] | None = None, version: int = 0) -> None:
        self.model = copy.deepcopy(model).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.allowed = torch.tensor(sorted(set(allowed_token_ids)), dtype=torch.long) if allowed_token_ids else None
        self._version = version
        self._lock = threading.RLock()  # weight loads must not interleave with a forward pass

    @property
    def version(self) -> int:
        return self._version

    def _sample(self, prompt_ids: list[int], sp: SamplingParams) -> Generation:
        gen = torch.Generator().manual_seed(sp.seed) if sp.seed is not None else None
        out_ids: list[int] = []
        out_lp: list[float] = []
        finish = "length"
        with self._lock, torch.no_grad():
            version = self._version
            ids = torch.tensor([prompt_ids], dtype=torch.long)
            past: Any = None
            for _ in range(sp.max_tokens):
                res = self.model(input_ids=ids, past_key_values=past, use_cache=True)
                past = res.past_key_values
                logits = restrict_logits(res.logits[0, -1].float(), self.allowed)
                # the logprob under the distribution the token was drawn from (logits / T), as the Generation
                # contract says and the trainer recomputes; greedy reports the temperature-1 logprob
                logp = torch.log_softmax(logits / sp.temperature if sp.temperature > 0 else logits, -1)
                if sp.temperature <= 0:
                    tok = int(torch.argmax(logp))
                else:
                    tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
                out_ids.append(tok)
                out_lp.append(float(logp[tok]))
                if tok in sp.stop_token_ids:
                    finish = "stop"
                    break
                ids = torch.tensor([[tok]], dtype=torch.long)
        return Generation(tuple(out_ids), tuple(out_lp), finish, version)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        try:
            return await asyncio.to_thread(self._sample, list(prompt_ids), sampling)
        except RuntimeError as e:
            raise EngineError(f"local engine failed: {e}") from e

    def set_state_dict(self, state: dict[str, torch.Tensor], version: int) -> None:
        with self._lock:
            self.model.load_state_dict(state, strict=False)
            self._version = version

    async def update_weights(self, checkpoint_dir: str, version: int) -> None:
        """Load the versioned safetensors checkpoint the trainer wrote."""
        from safetensors.torch import load_file

        files = sorted(Path(checkpoint_dir).glob("*.safetensors"))
        if not files:
            raise EngineError(f"no *.safetensors in {checkpoint_dir}")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f)))
        await asyncio.to_thread(self.set_state_dict, state, version)

    async def close(self) -> None:
        return None
