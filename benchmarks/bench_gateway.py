"""`sao bench gateway`: what the recording gateway costs per call, against calling the engine directly.

At each concurrency C, episodes of ``turns`` turns run C at a time through the gateway over HTTP (httpx, a
session per episode: turn 1 renders the prompt, later turns extend it; at least ``episodes_at_1`` episodes).
Then the very prompt ids the engine got are replayed straight into ``engine.generate``, C episodes at a time,
each turn after the one before, same sampling (greedy by default, so both paths sample the same tokens: the work
is the same). Reported side by side:

- ``wall ratio``: gateway wave wall time / direct wave wall time;
- ``overhead``: per call, client wall time minus the engine time the gateway measured around its own
  ``engine.generate``, summed over calls, as a share of the summed engine time (the target: under 5%);
- ``fixed cost``: the same gateway calls against an engine that answers at once (a scripted engine), in ms per
  call: the HTTP, parsing, rendering and recording work alone, whatever the model.

Each level runs gateway, direct, direct, gateway, so a load that drifts during it weighs on both paths alike.

Writes ``bench_gateway.json`` to ``out`` with the commit and the load average before and after, and prints a table.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sao.core.jsonl import write_json_atomic

QUESTIONS = [
    "Which command lists the files in a directory?",
    "How do I count the lines of a file?",
    "How do I search for a word in all Python files?",
    "How do I show the last 20 lines of a log?",
]
FOLLOW_UPS = ["It printed two names. What next?", "Thanks. Anything else to check?", "Say done."]


@dataclass
class GatewayBenchConfig:
    out: Path
    model: str = "smollm2"
    concurrency: tuple[int, ...] = (1, 16)
    turns: int = 3
    max_tokens: int = 8
    temperature: float = 0.0
    episodes_at_1: int = 4
    tokenizer: str | None = None


@dataclass
class Level:
    concurrency: int
    episodes: int
    calls: int
    direct_wall_s: float
    gateway_wall_s: float
    engine_s: float
    client_s: float
    same_tokens: bool

    @property
    def wall_ratio(self) -> float:
        return self.gateway_wall_s / self.direct_wall_s if self.direct_wall_s else 0.0

    @property
    def overhead(self) -> float:
        return (self.client_s - self.engine_s) / self.engine_s if self.engine_s else 0.0


@dataclass
class Report:
    setup: dict[str, Any] = field(default_factory=dict)
    levels: list[dict[str, Any]] = field(default_factory=list)
    fixed_cost_ms: dict[str, dict[str, float]] = field(default_factory=dict)


def _messages(i: int, replies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
    for t, reply in enumerate(replies):
        msgs += [reply, {"role": "user", "content": FOLLOW_UPS[t % len(FOLLOW_UPS)]}]
    return msgs


async def _gateway_episode(gw: Any, client: Any, i: int, cfg: GatewayBenchConfig) -> tuple[Any, float]:
    """One episode through the gateway: (its session record, the summed client wall time of its calls)."""
    sid = f"bench-{i}-{time.monotonic_ns()}"
    base = gw.open_session(sid)
    replies: list[dict[str, Any]] = []
    client_s = 0.0
    for _ in range(cfg.turns):
        body = {"messages": _messages(i, replies), "max_tokens": cfg.max_tokens}
        t0 = time.perf_counter()
        resp = await client.post(base + "/chat/completions", json=body)
        client_s += time.perf_counter() - t0
        resp.raise_for_status()
        replies.append(resp.json()["choices"][0]["message"])
    return gw.close_session(sid), client_s


@dataclass
class Waves:
    """Episodes through the gateway: their records, the waves' wall and CPU seconds (this process, the client
    included), and the summed wall seconds of each call as its client saw it."""

    records: list[Any]
    wall_s: float = 0.0
    cpu_s: float = 0.0
    client_s: float = 0.0


async def _gateway_waves(gw: Any, n: int, c: int, cfg: GatewayBenchConfig) -> Waves:
    """``n`` episodes through the gateway, ``c`` at a time (after a warm-up episode that is not counted)."""
    import httpx

    limits = httpx.Limits(max_connections=c + 4, max_keepalive_connections=c + 4)
    out = Waves([])
    async with httpx.AsyncClient(timeout=600.0, limits=limits) as client:
        await _gateway_episode(gw, client, 0, cfg)  # warm-up: connections, the template's compilation
        for first in range(0, n, c):
            t0, cpu0 = time.perf_counter(), time.process_time()
            done = await asyncio.gather(*(_gateway_episode(gw, client, i, cfg) for i in range(first, first + c)))
            out.wall_s += time.perf_counter() - t0
            out.cpu_s += time.process_time() - cpu0
            out.records += [r for r, _ in done]
            out.client_s += sum(s for _, s in done)
    return out


async def _direct_waves(engine: Any, records: list[Any], c: int, sampling: Any) -> tuple[float, bool]:
    """(wall seconds, same tokens as through the gateway) replaying the episodes' engine prompts directly, ``c``
    episodes at a time, each turn after the one before."""

    async def episode(rec: Any) -> bool:
        same = True
        for prompt, call in zip(rec.engine_prompts(), rec.engine_calls, strict=True):
            gen = await engine.generate(prompt, sampling)
            same = same and gen.token_ids == call.token_ids
        return same

    await engine.generate(next(records[0].engine_prompts()), sampling)  # warm-up
    wall, same = 0.0, True
    for first in range(0, len(records), c):
        t0 = time.perf_counter()
        wave = await asyncio.gather(*(episode(r) for r in records[first : first + c]))
        wall += time.perf_counter() - t0
        same = same and all(wave)
    return wall, same


async def _level(engine: Any, tok: Any, c: int, cfg: GatewayBenchConfig, context: int) -> Level:
    """Gateway, direct, direct, gateway (ABBA: a load that drifts during the level weighs on both paths alike)."""
    from sao.agent.engines.protocols import SamplingParams
    from sao.agent.gateway import Gateway

    n = max(c, cfg.episodes_at_1)
    gw = Gateway(engine, tok, max_context_tokens=context, max_action_tokens=cfg.max_tokens, temperature=cfg.temperature)
    sampling = SamplingParams(cfg.max_tokens, cfg.temperature, 1.0, (), tuple(gw.chat.stop_token_ids()))
    async with gw:
        a = await _gateway_waves(gw, n, c, cfg)
        direct_a, same_a = await _direct_waves(engine, a.records, c, sampling)
        direct_b, same_b = await _direct_waves(engine, a.records, c, sampling)
        b = await _gateway_waves(gw, n, c, cfg)
    calls = [call for r in a.records + b.records for call in r.engine_calls]
    engine_s = sum(x.engine_s for x in calls)
    gateway_s, client_s = a.wall_s + b.wall_s, a.client_s + b.client_s
    return Level(c, n, len(calls), direct_a + direct_b, gateway_s, engine_s, client_s, same_a and same_b)


async def _fixed_cost(tok: Any, cfg: GatewayBenchConfig, context: int) -> dict[str, dict[str, float]]:
    """Gateway calls to an engine that answers at once, per concurrency: ``wall_ms`` (wave wall time per call),
    ``latency_ms`` (a call's own wall time, queueing behind the others included) and ``cpu_ms`` (this process's CPU
    time per call, client included: the figure a loaded machine changes least)."""
    from sao.agent.engines.scripted import ScriptedEngine
    from sao.agent.gateway import Gateway

    action = [*tok.encode(" ls -la")[: cfg.max_tokens - 1], *tok.encode("<|im_end|>")][: cfg.max_tokens]
    engine = ScriptedEngine([action])
    out = {}
    for c in cfg.concurrency:
        n = max(c, cfg.episodes_at_1)
        async with Gateway(engine, tok, max_context_tokens=context, max_action_tokens=cfg.max_tokens) as gw:
            w = await _gateway_waves(gw, n, c, cfg)
        calls = sum(r.calls for r in w.records)
        out[str(c)] = {"wall_ms": 1000 * w.wall_s / calls, "latency_ms": 1000 * w.client_s / calls}
        out[str(c)]["cpu_ms"] = 1000 * w.cpu_s / calls
    return out


def _commit() -> str | None:
    try:
        cmd = ["git", "rev-parse", "--short", "HEAD"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=Path(__file__).parent)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.strip() or None


async def _run(cfg: GatewayBenchConfig, echo: Any) -> Report:
    from sao.agent.engines.registry import SpecOptions, build_spec_model, parse_model_spec

    context = 2048
    built = await build_spec_model(
        parse_model_spec(cfg.model), SpecOptions(tokenizer=cfg.tokenizer, max_context_tokens=context)
    )
    if built.engine is None:
        raise ValueError(f"--model {cfg.model!r} is evaluation-only; the gateway needs a token engine (hf:, vllm:)")
    report = Report(setup={**{k: str(v) for k, v in asdict(cfg).items()}, "commit": _commit()})
    report.setup["load_avg_start"] = os.getloadavg()
    try:
        report.fixed_cost_ms = await _fixed_cost(built.tokenizer, cfg, context)
        for level_name, cost in report.fixed_cost_ms.items():
            echo(f"instant engine, concurrency {level_name}: per call {cost['wall_ms']:.2f} ms of wall, "
                 f"{cost['latency_ms']:.2f} ms latency, {cost['cpu_ms']:.2f} ms CPU (client included)")  # fmt: skip
        echo(HEADER)
        for c in cfg.concurrency:
            level = await _level(built.engine, built.tokenizer, c, cfg, built.max_context_tokens or context)
            report.levels.append({**asdict(level), "wall_ratio": level.wall_ratio, "overhead": level.overhead})
            echo(_row(level))
    finally:
        await built.engine.close()
    report.setup["load_avg_end"] = os.getloadavg()
    return report


def _row(lv: Level) -> str:
    return (
        f"{lv.concurrency:11d}  {lv.calls:5d}  {lv.direct_wall_s:8.2f}  {lv.gateway_wall_s:9.2f}  {lv.wall_ratio:5.3f}"
        f"  {1000 * lv.engine_s / lv.calls:9.1f}  {1000 * (lv.client_s - lv.engine_s) / lv.calls:11.2f}"
        f"  {100 * lv.overhead:7.2f}%  {'yes' if lv.same_tokens else 'no'}"
    )


HEADER = "concurrency  calls  direct_s  gateway_s  ratio  engine_ms  overhead_ms  overhead  same tokens"


def run(cfg: GatewayBenchConfig, echo: Any = print) -> Report:
    """Run the benchmark, write ``bench_gateway.json`` under ``cfg.out``, print the table; return the report."""
    if cfg.turns < 1 or cfg.max_tokens < 1 or not cfg.concurrency or min(cfg.concurrency) < 1:
        raise ValueError("--turns, --max-tokens and every --concurrency level must be >= 1")
    cfg.out.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(_run(cfg, echo))
    write_json_atomic(cfg.out / "bench_gateway.json", asdict(report), indent=2)
    echo(f"load average {report.setup['load_avg_start'][0]:.1f} -> {report.setup['load_avg_end'][0]:.1f}; "
         f"commit {report.setup['commit']}; wrote {cfg.out / 'bench_gateway.json'}")  # fmt: skip
    return report
