"""`sao bench algos`: vectorised skip-observation GAE vs the per-sequence loop reference: speed and peak memory.

Synthetic multi-turn rows (prompt, then alternating action / observation blocks, ~``obs_frac`` non-action
tokens, ragged lengths with right padding) stand in for a real batch; only the mask layout matters to the cost.
The loop reference (plain Python floats, the fastest pure-Python form) runs on ``loop_rows`` rows and is
extrapolated linearly to the whole batch (it is a loop over rows, so its cost is linear in them); the same loop
written over tensor elements is timed on one row for context. The output says so. Peak memory is the process's
resident high-water mark above its level before the call (``/proc/self/status`` VmHWM, reset through
``/proc/self/clear_refs``, with glibc told to unmap freed blocks so resident memory tracks live memory), or the
CUDA allocator's peak.
"""

from __future__ import annotations

import ctypes
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from sao.core.jsonl import write_text_durably
from sao.trainer.algos.advantages import skip_observation_gae
from sao.trainer.algos.reference import skip_observation_gae_loop, skip_observation_gae_tensor_loop

GAMMA, LAM = 0.99, 0.95


@dataclass(frozen=True)
class Inputs:
    rewards: torch.Tensor
    values: torch.Tensor
    action_mask: torch.Tensor


def make_inputs(batch: int, seq_len: int, obs_frac: float, seed: int = 0, device: str = "cpu") -> Inputs:
    """Rows of 90-100% of ``seq_len`` tokens: a prompt block, then action / observation blocks, then padding."""
    if not 0.0 <= obs_frac < 1.0:
        raise ValueError(f"obs_frac must be in [0, 1), got {obs_frac}")
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(batch, seq_len, dtype=torch.bool)
    rewards = torch.zeros(batch, seq_len)
    act_mean = 256.0
    obs_mean = act_mean * obs_frac / (1.0 - obs_frac)
    for b in range(batch):
        length = int(seq_len * (0.9 + 0.1 * torch.rand(1, generator=g).item()))
        pos = int(0.25 * obs_mean)  # the prompt counts as non-action tokens
        last = -1
        while pos < length:
            n = 1 + int(torch.empty(1).exponential_(1 / act_mean, generator=g).item())
            mask[b, pos : min(pos + n, length)] = True
            last = min(pos + n, length) - 1
            pos += n + int(torch.empty(1).exponential_(1 / max(obs_mean, 1e-9), generator=g).item())
        if last >= 0:
            rewards[b, last] = float(torch.rand(1, generator=g).item() < 0.5)
    values = torch.randn(batch, seq_len, generator=g)
    return Inputs(rewards.to(device), values.to(device), mask.to(device))


def _times(fn: Callable[[], object], repeats: int, sync: Callable[[], None]) -> list[float]:
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _peak_child(which: str, batch: int, seq_len: int, obs_frac: float, rows: int) -> None:
    """Runs in a fresh process: prints the resident high-water mark added by one call of ``which``."""
    # Every block >= 64 KiB gets its own mapping, returned on free: resident memory then tracks live memory.
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD
    libc.mallopt(-1, 0)  # M_TRIM_THRESHOLD
    torch.set_num_threads(1)
    x = make_inputs(batch, seq_len, obs_frac)
    if which == "fast":
        args = (x.rewards, x.values, x.action_mask)
    else:
        args = (x.rewards[:rows].clone(), x.values[:rows].clone(), x.action_mask[:rows].clone())
    warm = make_inputs(2, 256, obs_frac, seed=1)  # one-time library set-up is not the call's memory
    skip_observation_gae(warm.rewards, warm.values, warm.action_mask, GAMMA, LAM)
    skip_observation_gae_loop(warm.rewards, warm.values, warm.action_mask, GAMMA, LAM)
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current VmRSS
    base = _status_kib("VmRSS")
    fn = skip_observation_gae if which == "fast" else skip_observation_gae_loop
    out = fn(*args, GAMMA, LAM)
    print(json.dumps({"peak_bytes": (_status_kib("VmHWM") - base) * 1024, "n": len(out)}))


def peak_bytes(which: str, batch: int, seq_len: int, obs_frac: float, rows: int, device: str) -> int | None:
    """Peak extra memory of one call (inputs excluded, outputs included), or None where it cannot be read.

    CPU: measured in a fresh process (``/proc/self/status`` VmHWM after a reset through ``/proc/self/clear_refs``)
    so that no memory freed earlier can hide the call's own allocations. CUDA: the caching allocator's peak.
    """
    if device.startswith("cuda") and which == "fast":
        x = make_inputs(batch, seq_len, obs_frac, device=device)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        skip_observation_gae(x.rewards, x.values, x.action_mask, GAMMA, LAM)
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated() - base)
    cmd = [
        sys.executable,
        "-m",
        "sao.benchmarks.bench_algos",
        which,
        str(batch),
        str(seq_len),
        str(obs_frac),
        str(rows),
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
        return int(json.loads(done.stdout.strip().splitlines()[-1])["peak_bytes"])
    except (subprocess.SubprocessError, OSError, ValueError, KeyError, IndexError):
        return None


def measure(
    batch: int,
    seq_len: int,
    obs_frac: float,
    loop_rows: int,
    repeats: int,
    device: str,
    seed: int = 0,
    loop_memory: bool = True,
) -> dict[str, Any]:
    x = make_inputs(batch, seq_len, obs_frac, seed, device)
    sync: Callable[[], None] = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def fast() -> tuple[torch.Tensor, torch.Tensor]:
        return skip_observation_gae(x.rewards, x.values, x.action_mask, GAMMA, LAM)

    fast()  # warm-up
    rows = max(1, min(loop_rows, batch))
    sub = (x.rewards[:rows].cpu(), x.values[:rows].cpu(), x.action_mask[:rows].cpu())
    ref_adv, ref_ret = skip_observation_gae_loop(*sub, GAMMA, LAM)
    # Interleaved, so both sides see the same load on a shared machine; the ratio is taken per pair.
    fast_times, loop_times = [], []
    for _ in range(repeats):
        fast_times += _times(fast, 1, sync)
        loop_times += _times(lambda: skip_observation_gae_loop(*sub, GAMMA, LAM), 1, lambda: None)
    pair_ratios = [lt * batch / rows / ft for ft, lt in zip(fast_times, loop_times, strict=True)]
    fast_peak = peak_bytes("fast", batch, seq_len, obs_frac, 0, device)
    loop_peak_rows = peak_bytes("loop", batch, seq_len, obs_frac, rows, "cpu") if loop_memory else None
    adv, ret = fast()
    err = max(
        float((adv[:rows].cpu().double() - ref_adv).abs().max()),
        float((ret[:rows].cpu().double() - ref_ret).abs().max()),
    )
    # The machine may be shared: the minimum over repeats is the least disturbed run of each, so ratios use it.
    fast_s, loop_rows_s = min(fast_times), min(loop_times)
    loop_s = loop_rows_s * batch / rows
    # the same loop over tensor elements, on one row only (it is ~10x slower again), for context
    t0 = time.perf_counter()
    skip_observation_gae_tensor_loop(sub[0][:1], sub[1][:1], sub[2][:1], GAMMA, LAM)
    tensor_loop_s = (time.perf_counter() - t0) * batch
    n_tokens = batch * seq_len
    return {
        "batch": batch,
        "seq_len": seq_len,
        "device": device,
        "action_frac": float(x.action_mask.float().mean()),
        "fast_s": fast_s,
        "fast_s_median": statistics.median(fast_times),
        "loop_s_extrapolated": loop_s,
        "loop_rows_measured": rows,
        "loop_s_measured": loop_rows_s,
        "speedup": loop_s / fast_s,
        "speedup_median_of_pairs": statistics.median(pair_ratios),
        "tensor_loop_s_extrapolated": tensor_loop_s,
        "speedup_vs_tensor_loop": tensor_loop_s / fast_s,
        "fast_peak_bytes": fast_peak,
        "fast_peak_bytes_per_token": None if fast_peak is None else fast_peak / n_tokens,
        "loop_peak_bytes_extrapolated": None if loop_peak_rows is None else loop_peak_rows * batch // rows,
        "max_abs_err_vs_loop": err,
    }


@dataclass(frozen=True)
class BenchConfig:
    out: Path
    batch: int = 64
    seq_len: int = 8192
    obs_frac: float = 0.4
    loop_rows: int = 8
    repeats: int = 10
    threads: int = 1
    device: str = "cpu"
    scale: bool = False
    png: bool = True


def _plot(points: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    sweeps = {
        "B sweep, T=8192": sorted((p for p in points if p["seq_len"] == 8192), key=lambda p: p["batch"]),
        "T sweep, B=64": sorted((p for p in points if p["batch"] == 64), key=lambda p: p["seq_len"]),
    }
    for (label, pts), marker in zip(sweeps.items(), ("o", "s"), strict=True):
        tokens = [p["batch"] * p["seq_len"] for p in pts]
        a.loglog(tokens, [p["fast_s"] for p in pts], marker + "-", label=f"vectorised, {label}")
        a.loglog(tokens, [p["loop_s_extrapolated"] for p in pts], marker + "--", label=f"loop, {label}")
        mem = [(t, p["fast_peak_bytes"] / 2**20) for t, p in zip(tokens, pts, strict=True) if p["fast_peak_bytes"]]
        b.plot([m[0] for m in mem], [m[1] for m in mem], marker + "-", label=label)
    a.set_xlabel("B x T tokens")
    a.set_ylabel("seconds (best run; loop extrapolated from a few rows)")
    a.legend(fontsize=7)
    b.set_xlabel("B x T tokens")
    b.set_ylabel("peak extra memory, MiB (vectorised)")
    b.legend(fontsize=7)
    fig.suptitle("skip-observation GAE")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(cfg: BenchConfig, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the benchmark, print a summary, write ``bench_algos.json`` (and a PNG with ``scale``) to ``cfg.out``."""
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device cuda asked for but torch sees no CUDA GPU; use --device cpu")
    torch.set_num_threads(cfg.threads)
    cfg.out.mkdir(parents=True, exist_ok=True)
    main = measure(cfg.batch, cfg.seq_len, cfg.obs_frac, cfg.loop_rows, cfg.repeats, cfg.device)
    result: dict[str, Any] = {"config": {**asdict(cfg), "out": str(cfg.out)}, "torch": torch.__version__}
    result["main"] = main
    echo(
        f"skip_observation_gae B={cfg.batch} T={cfg.seq_len} ({1 - main['action_frac']:.0%} non-action tokens, "
        f"{cfg.device}, {cfg.threads} thread(s)):"
    )
    med = main["fast_s_median"] * 1e3
    echo(f"  vectorised  {main['fast_s'] * 1e3:9.2f} ms  (best of {cfg.repeats}; median {med:.2f})")
    echo(
        f"  loop        {main['loop_s_extrapolated'] * 1e3:9.2f} ms  (best run on {main['loop_rows_measured']} rows: "
        f"{main['loop_s_measured'] * 1e3:.1f} ms, extrapolated linearly to {cfg.batch})"
    )
    met = "met" if main["speedup"] >= 50 else "NOT met"
    echo(
        f"  speed-up    {main['speedup']:9.1f} x   best vs best "
        f"(median over {cfg.repeats} interleaved pairs: {main['speedup_median_of_pairs']:.1f} x)"
    )
    echo(f"  goal >= 50 x: {met}")
    echo(
        f"  (vs the same loop indexing tensor elements, 1 row extrapolated: "
        f"{main['tensor_loop_s_extrapolated']:.2f} s, {main['speedup_vs_tensor_loop']:.0f} x)"
    )
    if main["fast_peak_bytes"] is not None:
        echo(
            f"  peak extra memory: vectorised {main['fast_peak_bytes'] / 2**20:.1f} MiB "
            f"({main['fast_peak_bytes_per_token']:.1f} B/token); loop ~"
            f"{main['loop_peak_bytes_extrapolated'] / 2**20:.1f} MiB (extrapolated)"
        )
    echo(f"  max |vectorised - loop| = {main['max_abs_err_vs_loop']:.2e}")
    if cfg.scale:
        points = []
        for b, t in ((8, 8192), (16, 8192), (32, 8192), (64, 8192), (64, 2048), (64, 4096), (64, 16384)):
            p = measure(b, t, cfg.obs_frac, min(cfg.loop_rows, 4), cfg.repeats, cfg.device, loop_memory=False)
            points.append(p)
            mem = "n/a" if p["fast_peak_bytes"] is None else f"{p['fast_peak_bytes'] / 2**20:.1f} MiB"
            bpt = "" if p["fast_peak_bytes"] is None else f" ({p['fast_peak_bytes_per_token']:.1f} B/token)"
            echo(
                f"  scale B={b:3d} T={t:5d}: {p['fast_s'] * 1e3:8.2f} ms, x{p['speedup']:.0f} "
                f"(pairs x{p['speedup_median_of_pairs']:.0f}), peak {mem}{bpt}"
            )
        result["scale"] = points
        if cfg.png:
            _plot(points, cfg.out / "bench_algos.png")
    path = cfg.out / "bench_algos.json"
    write_text_durably(path, json.dumps(result, indent=2))
    echo(f"wrote {path}")
    return result


if __name__ == "__main__":
    _peak_child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]))
