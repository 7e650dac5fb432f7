"""HFEngine on a tiny random-init Llama: batching, logprobs of the sampled distribution = the trainer's recompute,
in-place weights."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from sao.agent.engines.hf_engine import HFEngine
from sao.agent.engines.protocols import SamplingParams
from sao.core.tiny_models import build_tiny_model

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


def trainer_logprobs(
    model: torch.nn.Module, prompt: list[int], gen: tuple[int, ...], temperature: float
) -> torch.Tensor:
    """The trainer's recompute (``sao.trainer.algos.logprobs.token_logprobs``, logits / T) of ``gen`` after
    ``prompt``."""
    from sao.trainer.algos.logprobs import token_logprobs

    ids = torch.tensor([prompt + list(gen)])
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states[-1]
        lp, _ = token_logprobs(hidden, model.get_output_embeddings(), ids, temperature=temperature)
    return lp[0, len(prompt) :]


async def _lag0_gap(model: torch.nn.Module, temperature: float, top_p: float = 1.0) -> tuple[float, float]:
    """(max |rollout - trainer| logprob gap, max |raw T=1 logprob - trainer| gap), tokens sampled at ``temperature``."""
    engine = HFEngine(model, seed=1)
    gap, raw_gap = 0.0, 0.0
    for p in PROMPTS:
        g = await engine.generate(p, SamplingParams(max_tokens=8, temperature=temperature, top_p=top_p))
        ref = trainer_logprobs(model, p, g.token_ids, temperature)
        gap = max(gap, float((torch.tensor(g.logprobs) - ref).abs().max()))
        raw_gap = max(raw_gap, float((forward_logprobs(model, p, g.token_ids) - ref).abs().max()))
    await engine.close()
    return gap, raw_gap


async def test_logprob_gap_at_lag_0_is_as_small_at_temperature_07_as_at_1(model: torch.nn.Module) -> None:
    gap_1, _ = await _lag0_gap(model, 1.0)
    gap_07, raw_gap_07 = await _lag0_gap(model, 0.7)
    assert gap_1 < 1e-4
    assert gap_07 < max(2 * gap_1, 1e-5), (gap_07, gap_1)
    # What the engine reported before (logprobs of the T=1 distribution) is far off at T=0.7: the test can fail.
    assert raw_gap_07 > 1e-2


async def test_top_p_logprobs_are_renormalised_over_the_nucleus(model: torch.nn.Module) -> None:
    engine = HFEngine(model, seed=2)
    p = PROMPTS[0]
    g = await engine.generate(p, SamplingParams(max_tokens=6, temperature=0.7, top_p=0.5))
    tempered = trainer_logprobs(model, p, g.token_ids, 0.7)
    # The nucleus drops tokens: each sampled token is at least as likely under the renormalised distribution.
    assert all(a >= b - 1e-5 for a, b in zip(g.logprobs, tempered.tolist(), strict=True))
    assert all(lp <= 0.0 and lp > float("-inf") for lp in g.logprobs)
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
