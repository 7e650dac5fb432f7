"""`sao train` on an engine registered from outside the package: the toy run, two steps, with docs/register_engine.md's
``torch_sampler`` as ``rollout.engine`` (the trainer builds it from its registry entry and syncs weights into it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests._engine_doc import register_doc_engine

pytestmark = [pytest.mark.deepspeed]
ROOT = Path(__file__).resolve().parents[3]


def test_the_toy_run_trains_on_the_doc_engine(
    tmp_path: Path, deepspeed_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sao.trainer.runs.run import train

    sampler = register_doc_engine()["TorchSampler"]
    generated: list[int] = []
    synced: list[int] = []
    generate, update = sampler.generate, sampler.update_weights

    async def counted_generate(self: Any, prompt_ids: list[int], sampling: Any) -> Any:
        generated.append(self.version)
        return await generate(self, prompt_ids, sampling)

    async def counted_update(self: Any, checkpoint_dir: str, version: int) -> None:
        await update(self, checkpoint_dir, version)
        synced.append(self.version)

    monkeypatch.setattr(sampler, "generate", counted_generate)
    monkeypatch.setattr(sampler, "update_weights", counted_update)
    run = train(
        str(ROOT / "configs/toy.yaml"),
        [f"run.dir={tmp_path / 'run'}", "rollout.engine=torch_sampler", "run.total_steps=2", "trainer.batch_size=8",
         "deepspeed.micro_batch_size=8", "rollout.concurrency=8", "rollout.buffer_size=8", "run.progress=false",
         "run.plot=false", "run.tensorboard=false"],
    )  # fmt: skip
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert len(generated) >= 2 * 8 * 2  # every episode's turns (2 per episode) were sampled by it
    assert synced == [1, 2]  # the trainer pushed each new version into it (rollout.weight_sync=checkpoint)
