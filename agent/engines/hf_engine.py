"""HFEngine: in-process transformers generation, batched across concurrent callers, with versioned in-place weights.

Concurrent ``generate`` calls are queued; a background task takes what is waiting (up to ``max_batch``), groups
requests with the same temperature/top_p, left-pads them into one batch and runs ``model.generate`` in a
thread (the event loop stays free for envs). Logprobs are those of the distribution each token was drawn from:
``log_softmax`` of ``generate(output_scores=True)``'s scores, i.e. the logits after the same processors the
sampler used (temperature, then top-k, then top-p with renormalisation); greedy decoding reports the
temperature-1 logprob. A trainer that recomputes ``log_softmax(logits / T)`` gets the same numbers (top_p = 1).
Weights change in place under a lock, between batches: ``set_weights(state_dict, version)`` for a trainer in
the same process, ``update_weights(checkpoint_dir, version)`` from a safetensors checkpoint.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sao.agent.engines.protocols import EngineError, Generation, SamplingParams


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future[Generation] = field(repr=False)


class HFEngine:
    """Engine over a transformers causal LM (a model object, or a model dir loaded in ``dtype``)."""

    def __init__(
        self,
        model: Any,
        *,
        tokenizer: Any = None,
        version: int = 0,
        max_batch: int = 32,
        batch_wait_s: float = 0.005,
        dtype: str = "float32",
        seed: int | None = 0,
    ) -> None:
        import torch

        if isinstance(model, str | Path):
            from transformers import AutoModelForCausalLM, AutoTokenizer

            if not Path(model, "config.json").exists():
                raise ValueError(f"{model} is not a model directory (no config.json)")
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(model))
            model = AutoModelForCausalLM.from_pretrained(str(model), dtype=getattr(torch, dtype))
        self.model = model.eval()
        self.tokenizer = tokenizer
        gen_cfg = getattr(model, "generation_config", None)
        eos = getattr(gen_cfg, "eos_token_id", None)
        self.eos_ids: set[int] = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        pad = getattr(gen_cfg, "pad_token_id", None)
        self.pad_id = int(pad if pad is not None else (min(self.eos_ids) if self.eos_ids else 0))
        self._version = version
        self.max_batch, self.batch_wait_s = max_batch, batch_wait_s
        self._queue: asyncio.Queue[_Request] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._lock = threading.Lock()  # model weights vs. a running batch
        if seed is not None:
            torch.manual_seed(seed)
        self.stats = {"batches": 0, "requests": 0}

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        if not prompt_ids:
            raise ValueError("generate needs a non-empty prompt")
        if self._queue is None or self._worker is None or self._worker.done():
            self._queue = asyncio.Queue()
            self._worker = asyncio.create_task(self._serve(self._queue))
        fut: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Request(list(prompt_ids), sampling, fut))
        return await fut

    async def _serve(self, queue: asyncio.Queue[_Request]) -> None:
        while True:
            batch = [await queue.get()]
            await asyncio.sleep(self.batch_wait_s)  # let concurrent callers join this batch
            while not queue.empty() and len(batch) < self.max_batch:
                batch.append(queue.get_nowait())
            groups: dict[tuple[float, float, int], list[_Request]] = {}
            for r in batch:
                groups.setdefault((r.sampling.temperature, r.sampling.top_p, r.sampling.top_k), []).append(r)
            for reqs in groups.values():
                try:
                    gens = await asyncio.to_thread(self._generate_batch, reqs)
                except Exception as e:  # a failed batch fails its callers, not the server loop
                    for r in reqs:
                        if not r.future.done():
                            r.future.set_exception(EngineError(f"HF generation failed: {type(e).__name__}: {e}"))
                    continue
                for r, g in zip(reqs, gens, strict=True):
                    if not r.future.done():
                        r.future.set_result(g)

    def _generate_batch(self, reqs: list[_Request]) -> list[Generation]:
        import torch

        with self._lock, torch.inference_mode():
            version = self._version
            width = max(len(r.prompt_ids) for r in reqs)
            device = next(self.model.parameters()).device
            ids = torch.full((len(reqs), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(reqs), width), dtype=torch.long)
            for i, r in enumerate(reqs):
                ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
                mask[i, width - len(r.prompt_ids) :] = 1
            sp = reqs[0].sampling
            stops = sorted(self.eos_ids.union(*(r.sampling.stop_token_ids for r in reqs)))
            greedy = sp.temperature <= 0
            kw: dict[str, Any] = dict(
                max_new_tokens=max(r.sampling.max_tokens for r in reqs),
                do_sample=not greedy,
                eos_token_id=stops or None,
                pad_token_id=self.pad_id,
                output_scores=True,
                return_dict_in_generate=True,
            )
            if not greedy:
                kw.update(temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k)
            else:
                kw.update(temperature=None, top_p=None, top_k=None)
            out = self.model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **kw)
            seqs = out.sequences[:, width:]
            # One step at a time: never a [batch, steps, vocab] tensor. Scores hold the sampler's distribution.
            logps = torch.stack(
                [sc.float().log_softmax(-1).gather(1, seqs[:, j : j + 1])[:, 0] for j, sc in enumerate(out.scores)],
                dim=1,
            ).cpu()  # [batch, steps]
            new = seqs.cpu()
            self.stats["batches"] += 1
            self.stats["requests"] += len(reqs)
        return [self._cut(r, new[i], logps[i], set(stops), version) for i, r in enumerate(reqs)]

    def _cut(self, r: _Request, toks: Any, logps: Any, stops: set[int], version: int) -> Generation:
        """One row of the batch: up to and including the first stop token, at most ``max_tokens``."""
        row = toks.tolist()[: r.sampling.max_tokens]
        own_stops = self.eos_ids | set(r.sampling.stop_token_ids)
        n, reason = len(row), "length"
        for j, t in enumerate(row):
            if t in own_stops:
                n, reason = j + 1, "stop"
                break
        row = row[:n]
        lp = logps[:n].tolist()
        return Generation(tuple(row), tuple(lp), reason, version)

    def set_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Copy ``state_dict`` into the model in place (between batches) and move to ``version``."""
        import torch

        with self._lock, torch.no_grad():
            # state_dict names include tied aliases (lm_head.weight) that named_parameters() dedupes.
            params = self.model.state_dict(keep_vars=True)
            unknown = [k for k in state_dict if k not in params]
            if unknown:
                raise KeyError(f"set_weights: {len(unknown)} name(s) not in the model, e.g. {unknown[:3]}")
            for k, v in state_dict.items():
                params[k].copy_(v.to(params[k].dtype))
            self._version = version

    async def update_weights(self, checkpoint_dir: str, version: int) -> None:
        from sao.agent.engines.vllm_worker_ext import iter_safetensors

        state = await asyncio.to_thread(lambda: dict(iter_safetensors(checkpoint_dir)))
        params = set(self.model.state_dict().keys())
        # A checkpoint may omit a tied head or carry extra buffers: load the names the model has.
        state = {k: v for k, v in state.items() if k in params}
        if not state:
            raise EngineError(f"{checkpoint_dir} holds no tensor named like this model's parameters")
        await asyncio.to_thread(self.set_weights, state, version)

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except (asyncio.CancelledError, Exception):
                pass
            self._worker = None
