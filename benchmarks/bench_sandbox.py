"""`sao bench sandbox`: sandbox overheads side by side (raw SDK exec vs DockerSandbox, cold start vs warm pool,
env reset with and without the pool, concurrent episodes, a load of N concurrent Python-tool episodes through the
episode runner, bwrap), printed as a table and written as JSON."""

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

from sao.agent.engines.openai_chat import ChatReply
from sao.core.jsonl import write_text_durably
from sao.sandboxes.config import PoolConfig, SandboxConfig
from sao.sandboxes.docker import OWNER_PID_LABEL, DockerSandbox, get_client, run_blocking
from sao.sandboxes.images import require_base_image
from sao.sandboxes.pool import WarmPool, warm_pools

GOAL_EXEC_RATIO = 1.2
GOAL_ACQUIRE_P50_MS = 50.0
GOAL_RESET_P50_MS = 50.0
LOAD_TASK = {"id": "load", "problem": "Compute 6 * 7.", "answer": "42"}


def pct(xs: list[float], q: float) -> float:
    """The q-quantile (0..1) of ``xs`` by nearest rank."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def ms(x: float) -> float:
    return round(x * 1000, 2)


def cold_vs_warm(
    cold_name: str, cold: list[float], warm_name: str, warm: list[float], goal_ms: float
) -> dict[str, Any]:
    """p50 / p95 in ms of cold and warm timings (seconds), and the goal for the warm p50."""
    return {
        f"{cold_name}_p50_ms": ms(statistics.median(cold)),
        f"{cold_name}_p95_ms": ms(pct(cold, 0.95)),
        f"{warm_name}_p50_ms": ms(statistics.median(warm)),
        f"{warm_name}_p95_ms": ms(pct(warm, 0.95)),
        f"{warm_name}_goal_ms": goal_ms,
    }


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
    return {**cold_vs_warm("cold_start", cold, "pool_acquire", warm, GOAL_ACQUIRE_P50_MS), "n": n}


class ToolUser:
    """A scripted chat model for Python-tool episodes: one python call (printing the container's hostname and
    6 * 7), then the boxed answer: two env steps, one sandbox exec."""

    def __init__(self) -> None:
        self.turn = 0

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> ChatReply:
        self.turn += 1
        if self.turn == 1:
            call = {"name": "python", "arguments": {"code": "import socket\nprint(socket.gethostname())\nprint(6 * 7)"}}
            return ChatReply(f"<tool_call>{json.dumps(call)}</tool_call>")
        return ChatReply("The tool printed it: \\boxed{42}")


def owned_containers() -> int:
    """Containers (any state) that this process made and has not removed."""
    client = get_client()
    return len(client.api.containers(all=True, filters={"label": f"{OWNER_PID_LABEL}={os.getpid()}"}))


async def bench_env_reset(cfg: SandboxConfig, n: int) -> dict[str, Any]:
    """``PythonToolEnv.areset`` (the sandbox an episode starts with) cold vs from the episode runner's warm pool."""
    from sao.envs.python_tool import PythonToolEnv

    async def reset_once() -> float:
        env = PythonToolEnv(sandbox=cfg, max_steps=2)
        t0 = time.perf_counter()
        await env.areset(options={"task": LOAD_TASK})
        dt = time.perf_counter() - t0
        await env.aclose()
        return dt

    cold = [await reset_once() for _ in range(n)]
    warm = []
    async with warm_pools(2) as pools:
        await reset_once()  # first use of this sandbox config: its pool is made
        await reset_once()  # second use: from now on the pool keeps containers warm
        for _ in range(n):
            await pools.pools[0].wait_warm(120)
            warm.append(await reset_once())
    left = await run_blocking(owned_containers)
    return {**cold_vs_warm("cold_reset", cold, "pool_reset", warm, GOAL_RESET_P50_MS), "n": n, "containers_left": left}


async def run_load(cfg: SandboxConfig, episodes: int, concurrency: int | None = None) -> dict[str, Any]:
    """``episodes`` Python-tool episodes, ``concurrency`` (default: all) at once, through ``EpisodeRunner`` and its
    warm pool: completed, lost, episode p50/p95, errors by type, distinct containers, containers left after."""
    from collections import Counter

    from sao.agent.episodes import ChatPlayer, Episode, EpisodeRunner, RunnerConfig
    from sao.agent.records import Trajectory
    from sao.envs.python_tool import PythonToolEnv

    runner = EpisodeRunner(
        lambda: PythonToolEnv(sandbox=cfg, max_steps=4, code_timeout=120),
        ChatPlayer(per_task=lambda _: ToolUser(), max_turns=4),
        RunnerConfig(concurrency or episodes, progress=False),
    )
    trajs: list[Trajectory] = []
    t0 = time.perf_counter()
    await runner.run([Episode(i, LOAD_TASK, i, f"load-{i}") for i in range(episodes)], on_trajectory=trajs.append)
    wall = time.perf_counter() - t0
    errors = Counter(
        str(t.info.get("infra_error", "")).split(":", 1)[0] or "unknown" for t in trajs if t.status == "infra_error"
    )
    wrong = [t for t in trajs if t.status != "infra_error" and t.reward != 1.0]
    hosts = set()
    for t in trajs:
        tool_msgs = [m["content"] for m in t.info.get("messages", []) if m.get("role") in ("tool", "user")][1:]
        if tool_msgs and tool_msgs[0].strip():
            hosts.add(tool_msgs[0].split()[0])
    times = [t.timings.get("total_s", 0.0) for t in trajs]
    return {
        "episodes": episodes,
        "concurrency": concurrency or episodes,
        "completed": len(trajs),
        "lost": episodes - len(trajs),
        "solved": sum(t.reward == 1.0 for t in trajs),
        "wrong_answers": len(wrong),
        "infra_errors": sum(errors.values()),
        "errors_by_type": dict(errors),
        "distinct_containers": len(hosts),
        "episode_p50_s": round(statistics.median(times), 2) if times else None,
        "episode_p95_s": round(pct(times, 0.95), 2) if times else None,
        "wall_s": round(wall, 2),
        "containers_left": await run_blocking(owned_containers),
        "load_avg": os.getloadavg(),
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
    from sao.sandboxes.bwrap import BwrapSandbox

    times = []
    async with BwrapSandbox(SandboxConfig(backend="bwrap")) as sb:
        for _ in range(n):
            t0 = time.perf_counter()
            res = await sb.exec("true", timeout=30)
            times.append(time.perf_counter() - t0)
            assert res.exit_code == 0, res
    return {"bwrap_exec_p50_ms": ms(statistics.median(times)), "bwrap_exec_p95_ms": ms(pct(times, 0.95)), "n": n}


async def run_all(n: int, episodes: int, commands: int, pool_size: int, load: int) -> dict[str, Any]:
    image = await run_blocking(require_base_image)
    cfg = SandboxConfig(image=image, mem_limit="512m", cpus=1.0, pids_limit=256)
    results: dict[str, Any] = {
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "load": os.getloadavg()},
        "image": image,
    }
    steps: list[tuple[str, Callable[[], Awaitable[dict[str, Any]]]]] = [
        ("exec_overhead", lambda: bench_exec_overhead(cfg, n)),
        ("start", lambda: bench_start(cfg, max(5, n // 2))),
        ("env_reset", lambda: bench_env_reset(cfg, max(5, n // 2))),
        ("concurrent", lambda: bench_concurrent(cfg, episodes, commands, pool_size)),
        ("load", lambda: run_load(cfg, load)),
        ("bwrap", lambda: bench_bwrap(n)),
    ]
    for name, step in steps:
        t0 = time.perf_counter()
        results[name] = await step()
        print(f"[bench sandbox] {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return results


def table_rows(r: dict[str, Any]) -> list[tuple[str, str, str]]:
    e, s, c, b = r["exec_overhead"], r["start"], r["concurrent"], r["bwrap"]
    er, ld = r["env_reset"], r["load"]
    reset_ok = "ok" if er["pool_reset_p50_ms"] <= GOAL_RESET_P50_MS else "MISSED"
    load_ok = "ok" if ld["lost"] == 0 and ld["containers_left"] == 0 and not ld["wrong_answers"] else "FAILED"
    ratio_ok = "ok" if e["exec_ratio_p50"] <= GOAL_EXEC_RATIO else "MISSED"
    acq_ok = "ok" if s["pool_acquire_p50_ms"] <= GOAL_ACQUIRE_P50_MS else "MISSED"
    return [
        ("raw SDK exec p50", f"{e['raw_exec_p50_ms']} ms", ""),
        ("DockerSandbox.exec p50", f"{e['sandbox_exec_p50_ms']} ms", ""),
        ("exec overhead ratio (p50)", f"{e['exec_ratio_p50']}x", f"goal <= {GOAL_EXEC_RATIO}x: {ratio_ok}"),
        ("cold container start p50 / p95", f"{s['cold_start_p50_ms']} / {s['cold_start_p95_ms']} ms", ""),
        ("warm pool.acquire p50 / p95", f"{s['pool_acquire_p50_ms']} / {s['pool_acquire_p95_ms']} ms",
         f"goal <= {GOAL_ACQUIRE_P50_MS:.0f} ms: {acq_ok}"),
        ("PythonTool env reset p50, cold / warm pool",
         f"{er['cold_reset_p50_ms']} / {er['pool_reset_p50_ms']} ms",
         f"goal <= {GOAL_RESET_P50_MS:.0f} ms: {reset_ok}"),
        (f"load: {ld['episodes']} concurrent Python-tool episodes",
         f"{ld['completed']} completed, {ld['lost']} lost, {ld['infra_errors']} infra errors in {ld['wall_s']} s",
         f"{load_ok}; errors by type {ld['errors_by_type'] or 'none'}"),
        ("  episode p50 / p95", f"{ld['episode_p50_s']} / {ld['episode_p95_s']} s",
         f"{ld['distinct_containers']} distinct containers, {ld['containers_left']} left"),
        (f"{c['episodes']} episodes x {c['commands_per_episode']} commands",
         f"{c['succeeded']}/{c['episodes'] * c['commands_per_episode']} ok in {c['wall_s']} s",
         "all succeeded" if c["all_succeeded"] else "FAILURES"),
        ("  throughput", f"{c['throughput_cmd_per_s']} cmd/s", ""),
        ("  command latency p50 / p95", f"{c['cmd_p50_ms']} / {c['cmd_p95_ms']} ms", ""),
        ("bwrap exec p50", f"{b['bwrap_exec_p50_ms']} ms" if "bwrap_exec_p50_ms" in b else b.get("skipped", ""), ""),
    ]  # fmt: skip


def main(
    out: Path | None = None, n: int = 30, episodes: int = 32, commands: int = 20, pool_size: int = 8, load: int = 128
) -> dict[str, Any]:
    """Run every measurement, print the table, write the JSON to ``out`` (when given); returns the results."""
    from rich.console import Console
    from rich.table import Table

    results = asyncio.run(run_all(n, episodes, commands, pool_size, load))
    table = Table(title="sao bench sandbox")
    for col in ("measure", "value", "goal"):
        table.add_column(col)
    for row in table_rows(results):
        table.add_row(*row)
    Console().print(table)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_durably(out, json.dumps(results, indent=2) + "\n")
    return results
