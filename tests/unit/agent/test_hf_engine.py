"""HFEngine on a tiny random-init Llama: batching across callers, logprobs = forward pass, in-place weights."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from agent.engines.hf_engine import HFEngine
from agent.engines.protocols import SamplingParams
from saocore.tiny_models import build_tiny_model

VOCAB = 256


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    m = build_tiny_model("llama", vocab_size=VOCAB, seed=0)
    m.generation_config.eos_token_id = 3
    m.generation_config.pad_token_id = 0
    return m.eval()


def forward_logprobs(model: torch.nn.Module, prompt: list[int], gen: tuple[int, ...]) -> torch.Tensor:
    with torch.no_grad():
        lp = model(torch.tensor([prompt + list(gen)])).logits[0].log_softmax(-1)[len(prompt) - 1 : -1]
    return lp[torch.arange(len(gen)), torch.tensor(gen)]


PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [20] * 9]


async def test_concurrent_callers_share_a_batch_and_get_their_own_tokens(model: torch.nn.Module) -> None:
    engine = HFEngine(model, max_batch=8, batch_wait_s=0.05)
    sp = SamplingParams(max_tokens=6, temperature=0.0)
    batched = await asyncio.gather(*(engine.generate(p, sp) for p in PROMPTS))
    assert engine.stats["batches"] == 1 and engine.stats["requests"] == len(PROMPTS)
    for p, g in zip(PROMPTS, batched, strict=True):
        alone = await engine.generate(p, sp)
        assert g.token_ids == alone.token_ids  # left padding does not change a row's greedy tokens
        ref = forward_logprobs(model, p, g.token_ids)
        assert torch.allclose(torch.tensor(g.logprobs), ref, atol=1e-4)
    await engine.close()


async def test_sampled_logprobs_are_before_temperature(model: torch.nn.Module) -> None:
    engine = HFEngine(model, seed=1)
    g = await engine.generate(PROMPTS[0], SamplingParams(max_tokens=8, temperature=2.0, top_p=0.9))
    ref = forward_logprobs(model, PROMPTS[0], g.token_ids)
    assert torch.allclose(torch.tensor(g.logprobs), ref, atol=1e-4)
    await engine.close()


async def test_stop_tokens_and_max_tokens(model: torch.nn.Module) -> None:
    engine = HFEngine(model)
    free = await engine.generate(PROMPTS[1], SamplingParams(max_tokens=5, temperature=0.0))
    assert len(free.token_ids) <= 5
    stop_at = free.token_ids[1]
    cut = await engine.generate(PROMPTS[1], SamplingParams(max_tokens=5, temperature=0.0, stop_token_ids=(stop_at,)))
    assert cut.token_ids == free.token_ids[: free.token_ids.index(stop_at) + 1] and cut.finish_reason == "stop"
    await engine.close()


async def test_weights_change_in_place_with_the_version(model: torch.nn.Module, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    engine = HFEngine(model)
    sp = SamplingParams(max_tokens=4, temperature=0.0)
    before = await engine.generate(PROMPTS[0], sp)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        new = {k: v + 0.5 * torch.randn_like(v) for k, v in original.items() if k.endswith("weight")}
        engine.set_weights(new, 1)
        after = await engine.generate(PROMPTS[0], sp)
        assert after.version == 1 and after.logprobs != before.logprobs
        assert torch.allclose(
            torch.tensor(after.logprobs), forward_logprobs(model, PROMPTS[0], after.token_ids), atol=1e-4
        )
        save_file({k: v.contiguous() for k, v in original.items()}, str(tmp_path / "model.safetensors"))
        await engine.update_weights(str(tmp_path), 2)
        restored = await engine.generate(PROMPTS[0], sp)
        assert restored.version == 2 and restored.token_ids == before.token_ids
        with pytest.raises(KeyError, match="not in the model"):
            engine.set_weights({"nope.weight": torch.zeros(1)}, 3)
        assert engine.version == 2
    finally:
        model.load_state_dict(original)
        await engine.close()
