"""The in-process sampling engine reports logprobs of the distribution it sampled from (issue 23, defect 2)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from sao.agent.engines.local_engine import LocalEngine, restrict_logits
from sao.agent.engines.protocols import SamplingParams
from sao.core.tiny_models import build_tiny_model


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_reported_logprobs_match_the_tempered_recompute(temperature: float) -> None:
    # the trainer recomputes log_softmax(logits / T): at the same weights the DIS ratio must be exactly 1
    model = build_tiny_model("llama", seed=0)
    allowed = [5, 6, 7, 8]
    engine = LocalEngine(model, allowed_token_ids=allowed)
    prompt = [1, 2, 3]
    sp = SamplingParams(6, temperature, 1.0, (), (), seed=0)
    gen = asyncio.run(engine.generate(prompt, sp))
    ids = torch.tensor([prompt + list(gen.token_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    restricted = restrict_logits(logits, torch.tensor(allowed))
    logp = torch.log_softmax(restricted / temperature, -1)
    n = len(prompt)
    recompute = [float(logp[n - 1 + i, tok]) for i, tok in enumerate(gen.token_ids)]
    ratio = torch.exp(torch.tensor(gen.logprobs) - torch.tensor(recompute))
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-4), f"DIS ratio at lag 0: {ratio.tolist()}"
