"""`sao bench sandbox`: sandbox overheads side by side (raw SDK exec vs DockerSandbox, cold start vs warm pool,
concurrent episodes, bwrap), printed as a table and written as JSON."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sandboxes.config import PoolConfig, SandboxConfig
from sandboxes.docker import DockerSandbox, run_blocking
from sandboxes.images import ensure_base_image
from sandboxes.pool import WarmPool

GOAL_EXEC_RATIO = 1.2
GOAL_ACQUIRE_P50_MS = 50.0


def pct(xs: list[float], q: float) -> float:
    """The q-quantile (0..1) of ``xs`` by nearest rank."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def ms(x: float) -> float:
    return round(x * 1000, 2)


async def bench_exec_overhead(cfg: SandboxConfig, n: int) -> dict[str, Any]:
    """Alternate a raw ``container.exec_run`` and ``DockerSandbox.exec`` of the same command on one container."""
    raw_s, sb_s = [], []
    async with await DockerSandbox.create(cfg) as sb:
        container = sb.client.containers.get(sb.id)
        cmd = "true"
        for _ in range(3):  # warm both paths
            await run_blocking(container.exec_run, ["bash", "-c", cmd])
            await sb.exec(cmd, timeout=30)
        for _ in range(n):
            t0 = time.perf_counter()
            code, _ = await run_blocking(container.exec_run, ["bash", "-c", cmd])
            raw_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            res = await sb.exec(cmd, timeout=30)
            sb_s.append(time.perf_counter() - t0)
            assert code == 0 and res.exit_code == 0
    raw_p50, sb_p50 = statistics.median(raw_s), statistics.median(sb_s)
    return {
        "raw_exec_p50_ms": ms(raw_p50),
        "sandbox_exec_p50_ms": ms(sb_p50),
        "exec_ratio_p50": round(sb_p50 / raw_p50, 3),
        "exec_ratio_goal": GOAL_EXEC_RATIO,
        "n": n,
    }


async def bench_start(cfg: SandboxConfig, n: int) -> dict[str, Any]:
    """Cold ``DockerSandbox.create`` vs ``WarmPool.acquire`` with a warm pool (waiting for refill between)."""
    cold = []
    for _ in range(n):
        t0 = time.perf_counter()
        sb = await DockerSandbox.create(cfg)
        cold.append(time.perf_counter() - t0)
        await sb.close()
    warm = []
    pool = await WarmPool(cfg, PoolConfig(size=2, max_concurrency=4)).start()
    try:
        for _ in range(n):
            await pool.wait_warm(120)
            t0 = time.perf_counter()
            sb = await pool.acquire()
            warm.append(time.perf_counter() - t0)
            await sb.close()
    finally:
        await pool.aclose()
    return {
        "cold_start_p50_ms": ms(statistics.median(cold)),
        "cold_start_p95_ms": ms(pct(cold, 0.95)),
        "pool_acquire_p50_ms": ms(statistics.median(warm)),
        "pool_acquire_p95_ms": ms(pct(warm, 0.95)),
        "pool_acquire_goal_ms": GOAL_ACQUIRE_P50_MS,
        "n": n,
    }


async def bench_concurrent(cfg: SandboxConfig, episodes: int, commands: int, pool_size: int) -> dict[str, Any]:
    """``episodes`` concurrent episodes, each leasing a container and running ``commands`` commands."""
    latencies: list[float] = []
    failures: list[str] = []
    pool = await WarmPool(cfg, PoolConfig(size=pool_size, max_concurrency=episodes)).start()

    async def episode(i: int) -> None:
        async with pool.lease() as sb:
            for j in range(commands):
                t0 = time.perf_counter()
                res = await sb.exec(f"echo {i}-{j} && ls / >/dev/null", timeout=120)
                latencies.append(time.perf_counter() - t0)
                if res.exit_code != 0 or res.output != f"{i}-{j}\n":
                    failures.append(f"episode {i} command {j}: exit {res.exit_code} {res.output[:200]!r}")

    try:
        await pool.wait_warm(120)
        t0 = time.perf_counter()
        results = await asyncio.gather(*(episode(i) for i in range(episodes)), return_exceptions=True)
        wall = time.perf_counter() - t0
    finally:
        await pool.aclose()
    bad_commands = len(failures)
    failures += [f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)]
    total = episodes * commands
    return {
        "episodes": episodes,
        "commands_per_episode": commands,
        "succeeded": len(latencies) - bad_commands,
        "all_succeeded": not failures and len(latencies) == total,
        "failures": failures[:5],
        "wall_s": round(wall, 2),
        "throughput_cmd_per_s": round(total / wall, 1),
        "cmd_p50_ms": ms(statistics.median(latencies)) if latencies else None,
        "cmd_p95_ms": ms(pct(latencies, 0.95)) if latencies else None,
    }


async def bench_bwrap(n: int) -> dict[str, Any]:
    if shutil.which("bwrap") is None:
        return {"skipped": "bubblewrap is not installed (apt-get install bubblewrap)"}
    from sandboxes.bwrap import BwrapSandbox

    times = []
    async with BwrapSandbox(SandboxConfig(backend="bwrap")) as sb:
        for _ in range(n):
            t0 = time.perf_counter()
            res = await sb.exec("true", timeout=30)
            times.append(time.perf_counter() - t0)
            assert res.exit_code == 0, res
    return {"bwrap_exec_p50_ms": ms(statistics.median(times)), "bwrap_exec_p95_ms": ms(pct(times, 0.95)), "n": n}


async def run_all(n: int, episodes: int, commands: int, pool_size: int) -> dict[str, Any]:
    image = await run_blocking(ensure_base_image)
    cfg = SandboxConfig(image=image, mem_limit="512m", cpus=1.0, pids_limit=256)
    results: dict[str, Any] = {
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "load": os.getloadavg()},
        "image": image,
    }
    steps: list[tuple[str, Callable[[], Awaitable[dict[str, Any]]]]] = [
        ("exec_overhead", lambda: bench_exec_overhead(cfg, n)),
        ("start", lambda: bench_start(cfg, max(5, n // 2))),
        ("concurrent", lambda: bench_concurrent(cfg, episodes, commands, pool_size)),
        ("bwrap", lambda: bench_bwrap(n)),
    ]
    for name, step in steps:
        t0 = time.perf_counter()
        results[name] = await step()
        print(f"[bench sandbox] {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return results


def table_rows(r: dict[str, Any]) -> list[tuple[str, str, str]]:
    e, s, c, b = r["exec_overhead"], r["start"], r["concurrent"], r["bwrap"]
    ratio_ok = "ok" if e["exec_ratio_p50"] <= GOAL_EXEC_RATIO else "MISSED"
    acq_ok = "ok" if s["pool_acquire_p50_ms"] <= GOAL_ACQUIRE_P50_MS else "MISSED"
    return [
        ("raw SDK exec p50", f"{e['raw_exec_p50_ms']} ms", ""),
        ("DockerSandbox.exec p50", f"{e['sandbox_exec_p50_ms']} ms", ""),
        ("exec overhead ratio (p50)", f"{e['exec_ratio_p50']}x", f"goal <= {GOAL_EXEC_RATIO}x: {ratio_ok}"),
        ("cold container start p50 / p95", f"{s['cold_start_p50_ms']} / {s['cold_start_p95_ms']} ms", ""),
        ("warm pool.acquire p50 / p95", f"{s['pool_acquire_p50_ms']} / {s['pool_acquire_p95_ms']} ms",
         f"goal <= {GOAL_ACQUIRE_P50_MS:.0f} ms: {acq_ok}"),
        (f"{c['episodes']} episodes x {c['commands_per_episode']} commands",
         f"{c['succeeded']}/{c['episodes'] * c['commands_per_episode']} ok in {c['wall_s']} s",
         "all succeeded" if c["all_succeeded"] else "FAILURES"),
        ("  throughput", f"{c['throughput_cmd_per_s']} cmd/s", ""),
        ("  command latency p50 / p95", f"{c['cmd_p50_ms']} / {c['cmd_p95_ms']} ms", ""),
        ("bwrap exec p50", f"{b['bwrap_exec_p50_ms']} ms" if "bwrap_exec_p50_ms" in b else b.get("skipped", ""), ""),
    ]  # fmt: skip


def main(
    out: Path | None = None, n: int = 30, episodes: int = 32, commands: int = 20, pool_size: int = 8
) -> dict[str, Any]:
    """Run every measurement, print the table, write the JSON to ``out`` (when given); returns the results."""
    from rich.console import Console
    from rich.table import Table

    results = asyncio.run(run_all(n, episodes, commands, pool_size))
    table = Table(title="sao bench sandbox")
    for col in ("measure", "value", "goal"):
        table.add_column(col)
    for row in table_rows(results):
        table.add_row(*row)
    Console().print(table)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
    return results
