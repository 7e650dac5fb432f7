"""GPU checks of the scale-out path (marker ``gpu``, never run in CI; written without a GPU machine: unverified).

- NCCL weight sync: the trainer's model on GPU 0 broadcasts into a vLLM server on GPU 1 (NCCL refuses two ranks on
  one device); logprobs then match the trainer's forward as after a checkpoint reload.
- The Ray backend on 3 GPUs: 2 trainer ranks (one GPU each, NCCL) and one engine (one GPU), broadcast sync.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import free_port

pytestmark = [pytest.mark.gpu, pytest.mark.vllm, pytest.mark.timeout(1800)]


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def needs_gpus(n: int) -> pytest.MarkDecorator:
    """Skip before any fixture runs (a fixture may need what a GPU machine lacks, e.g. the converted SmolLM2)."""
    return pytest.mark.skipif(_gpus() < n, reason=f"needs {n} CUDA GPU(s); found {_gpus()}")


@needs_gpus(2)
async def test_nccl_broadcast_into_a_vllm_gpu_server(
    smollm2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("vllm", reason="vllm (the GPU build) is not installed")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sao.agent.engines.protocols import SamplingParams
    from sao.agent.engines.vllm_engine import VLLMEngine
    from sao.agent.engines.vllm_server import LocalVLLMServer
    from sao.trainer.cluster.weights import BroadcastSync, push

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    model: Any = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).to("cuda:0")
    model.eval()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # the server's process only; this one already holds GPU 0
    server = LocalVLLMServer.start(str(smollm2_dir), port=free_port(), log_path=str(tmp_path / "vllm.log"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    engine = VLLMEngine([server.url])
    try:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        syncer = BroadcastSync(model, host="127.0.0.1", bucket_mb=256, timeout_s=120)

        def lead(cmd: Any) -> dict[str, float]:  # trainer.runs.commands.PushWeights
            plan = cmd.plan
            assert plan.backend == "nccl"
            return push(model, syncer.pg, plan, zero3=False, device="cuda:0")

        stats = await syncer.sync(engine, 1, lead)
        print(f"NCCL sync of {stats['sync_bytes'] / 2**20:.0f} MiB: {stats['sync_s']:.3f} s")
        chat = [{"role": "user", "content": "Name a planet."}]
        ids = list(tok.encode(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)))
        gen = await engine.generate(ids, SamplingParams(max_tokens=16, temperature=0.0))
        with torch.no_grad():
            logits = model(torch.tensor([ids + list(gen.token_ids)], device="cuda:0")).logits[0].float()
        lp = logits.log_softmax(-1)[len(ids) - 1 : -1][torch.arange(len(gen.token_ids)), list(gen.token_ids)]
        gap = float((lp.cpu() - torch.tensor(gen.logprobs)).abs().mean())
        print(f"mean |dlogp| after the NCCL sync: {gap:.1e}")
        assert engine.version == 1 and gap < 1e-2
    finally:
        await engine.close()
        server.stop()


@needs_gpus(3)
def test_ray_backend_on_three_gpus(tmp_path: Path) -> None:
    for mod in ("ray", "vllm", "gymnasium"):
        pytest.importorskip(mod, reason=f"{mod} is not installed (the Ray run serves vLLM engines on TokenGame)")
    import ray

    from sao.trainer.runs.run import train
    from tests.integration.cluster.test_ray_backend import STEPS, overrides

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_gpus=3, num_cpus=8, namespace="sao", include_dashboard=False)
    try:
        run_dir = tmp_path / "run"
        cfg = tmp_path / "cfg.yaml"
        cfg.write_text("{}\n")
        ov = [o for o in overrides(run_dir, "ray") if not o.startswith("cluster.")]
        ov += [
            "cluster.backend=ray",
            "cluster.trainer_ranks=2",
            "cluster.rollout_workers=2",
            "cluster.trainer_resources={num_cpus: 1, num_gpus: 1}",
            "cluster.engine_resources={num_cpus: 1, num_gpus: 1}",
            "cluster.rollout_resources={num_cpus: 1}",
            "deepspeed.bf16=true",
        ]
        train(str(cfg), ov)
        metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
        print("weight_sync_s", [m["weight_sync_s"] for m in metrics])
        assert [m["version"] for m in metrics] == list(range(1, STEPS + 1))
    finally:
        ray.shutdown()
