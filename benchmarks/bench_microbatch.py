"""`sao bench microbatch`: micro batches by the old row cut vs by a token budget, on the real learner step.

Both variants train the same batch of trajectories with the same model and the same config, each in a fresh process:

- ``rows``: ``deepspeed.micro_batch_tokens=0``, the cut the trainer had: ``micro_batch_size`` rows per micro batch in
  batch order, every micro batch padded to the longest row of the whole batch;
- ``tokens``: ``deepspeed.micro_batch_tokens=BUDGET`` (the trainer's default cut): rows sorted by length, each
  micro batch within the budget and ``micro_batch_size`` rows, padded only to its own longest row.

The step is ``Learner.train_step`` of SAO (critic values, the DIS policy step, K critic steps) on DeepSpeed. Reported
per variant: micro batches, the padding fraction (padded positions over all positions the model ran on), real tokens
per second of the step, and the step's peak memory: the process's peak resident set (``VmHWM``) above its level just
before the step, as `sao bench memory` reads it (high-water mark reset through ``/proc/self/clear_refs``, glibc told
to return freed blocks). A warm-up step on the two shortest trajectories runs first, so the weights, optimizer
moments and library set-up are not counted; torch's CPU allocator keeps no peak of its own, hence RSS.

Trajectories: a JSONL of them (e.g. a run's ``trajectories.jsonl``, read as value pretraining reads it) or, by
default, synthetic SWE-style episodes tokenized with the real SmolLM2 tokenizer: a task prompt, then turns of a tool
call and its output (source files and test logs), observation-heavy, with heavy-tailed lengths (a Pareto tail
between ``min_tokens`` and ``max_tokens``, as SWE episodes have).
"""

from __future__ import annotations

import ctypes
import json
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sao.benchmarks.rl_bench_common import print_table, write_json
from sao.core.jsonl import write_text_durably

VARIANTS = ("rows", "tokens")


@dataclass(frozen=True)
class MicrobatchBenchConfig:
    out: Path
    trajectories: Path | None = None
    """A JSONL (or parquet) of trajectories; None: synthetic SWE-style episodes."""
    model: str = "smollm2"
    """A model dir, ``smollm2`` or ``tiny:llama`` (``--tiny``: a smoke test in seconds)."""
    n: int = 8
    """Trajectories in the batch (the first ``n`` of the file)."""
    min_tokens: int = 300
    max_tokens: int = 3000
    micro_batch_size: int = 4
    micro_batch_tokens: int = 4096
    critic_steps: int = 1
    layers: int = 0
    """Keep only the first N decoder layers (0 = all): the same rows, widths and vocabulary at a fraction of the
    depth, for a machine too busy for the whole model."""
    gradient_checkpointing: bool = True
    """As the SWE configs train (long rows); the rows' activations then scale with the positions of a micro batch
    through each layer's recompute and the kept layer inputs."""
    threads: int = 0
    seed: int = 0
    timeout_s: float = 3600.0


# -- synthetic SWE-style trajectories --------------------------------------------------------------------------


def _corpus() -> list[str]:
    """Real source text to show as file views and test logs: the Python standard library's own modules."""
    import json as json_mod

    root = Path(json_mod.__file__).resolve().parents[1]
    names = ["argparse.py", "textwrap.py", "difflib.py", "shlex.py", "fractions.py", "statistics.py", "csv.py"]
    return [(root / n).read_text(encoding="utf-8") for n in names if (root / n).is_file()]


def target_lengths(n: int, min_tokens: int, max_tokens: int, rng: random.Random) -> list[int]:
    """Heavy-tailed episode lengths, in random order: the ``(i + 0.5) / n`` quantiles of a Pareto (alpha 1.2) from
    ``min_tokens``, capped at ``max_tokens``. Quantiles, not draws, so that a batch of 8 already holds the tail
    (8 from 300-3000: 316, 356, 409, 484, 597, 790, 1210 and 3000 tokens, median ~540, as SWE episodes spread)."""
    out = [min(int(min_tokens * (1 - (i + 0.5) / n) ** (-1 / 1.2)), max_tokens) for i in range(n)]
    rng.shuffle(out)
    return out


def synthetic_trajectories(cfg: MicrobatchBenchConfig, tokenizer: Any) -> list[Any]:
    """``cfg.n`` multi-turn episodes of about their target length: prompt, then (tool call, tool output) turns;
    rewards alternate 0/1 so the batch is not uniform (a uniform batch skips the policy step)."""
    from sao.agent.records import Segment, Trajectory

    rng = random.Random(cfg.seed)
    texts = _corpus()
    if not texts:
        raise FileNotFoundError("no standard-library source found to build synthetic observations from")

    def enc(text: str) -> list[int]:
        return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]

    out = []
    for i, target in enumerate(target_lengths(cfg.n, cfg.min_tokens, cfg.max_tokens, rng)):
        prompt = enc(f"Fix the failing test tests/test_{i}.py. The traceback names the function to repair.\n")
        segs: list[Segment] = [Segment("prompt", tuple(prompt))]
        n = len(prompt)
        turn = 0
        while n < target:
            call = f'{{"name": "bash", "arguments": {{"command": "sed -n {turn * 40},+60p src/module_{i}.py"}}}}'
            act = enc(call)[: max(target - n, 1)]
            segs.append(Segment("action", tuple(act), tuple(-1.0 for _ in act), 0, None))
            n += len(act)
            if n >= target:
                break
            src = texts[rng.randrange(len(texts))]
            start = rng.randrange(max(len(src) - 4000, 1))
            obs = enc(src[start : start + rng.randint(300, 2500)])[: target - n]
            segs.append(Segment("observation", tuple(obs)))
            n += len(obs)
            turn += 1
        if segs[-1].kind != "action":
            act = enc('{"name": "submit", "arguments": {}}')
            segs.append(Segment("action", tuple(act), tuple(-1.0 for _ in act), 0, None))
        out.append(Trajectory(f"synthetic-{i}", "sao/SWE-v0", tuple(segs), float(i % 2)))
    return out


def load_batch(cfg: MicrobatchBenchConfig) -> list[Any]:
    """The batch both variants train on, in its own (unsorted) order."""
    if cfg.trajectories is not None:
        from sao.trainer.learn.value_pretrain import read_rollouts

        trajs = read_rollouts(cfg.trajectories)[: cfg.n]
        if len(trajs) < 2:
            raise ValueError(f"{cfg.trajectories}: {len(trajs)} trainable trajectories; the bench needs 2 or more")
        return trajs
    from transformers import AutoTokenizer

    from sao.core.paths import smollm2_dir

    return synthetic_trajectories(cfg, AutoTokenizer.from_pretrained(str(smollm2_dir())))


# -- one variant, in a fresh process ---------------------------------------------------------------------------


def _train_config(cfg: MicrobatchBenchConfig, variant: str, n: int, longest: int) -> Any:
    from sao.trainer.config import config_from_dict

    tokens = 0 if variant == "rows" else cfg.micro_batch_tokens
    model: dict[str, Any] = {"path": cfg.model, "gradient_checkpointing": cfg.gradient_checkpointing}
    if cfg.model.startswith("tiny:"):
        model["tiny_overrides"] = {"max_position_embeddings": max(2048, longest)}
    return config_from_dict(
        {
            "model": model,
            "trainer": {"algorithm": "sao", "batch_size": n, "critic_updates_per_step": cfg.critic_steps},
            "deepspeed": {"micro_batch_size": cfg.micro_batch_size, "micro_batch_tokens": tokens},
            "run": {"seed": cfg.seed},
        }
    )


def _child(cfg: MicrobatchBenchConfig, variant: str) -> dict[str, Any]:
    import torch

    from sao.benchmarks.bench_memory import _status_kib
    from sao.trainer import distributed
    from sao.trainer.learn.batch import collate, shard_batch
    from sao.trainer.learn.learner import Learner
    from sao.trainer.learn.models import load_actor, load_critic, load_tokenizer
    from sao.trainer.learn.value_pretrain import read_rollouts

    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD: big blocks get their own mapping, unmapped on free
    libc.mallopt(-1, 0)  # M_TRIM_THRESHOLD
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    trajs = read_rollouts(cfg.out / "batch.jsonl")
    tc = _train_config(cfg, variant, len(trajs), max(t.num_tokens for t in trajs))
    distributed.init_distributed()
    pad = int(load_tokenizer(tc).pad_token_id)
    full = collate(trajs, pad)
    micro = shard_batch(full, tc.deepspeed)
    torch.manual_seed(cfg.seed)  # the critic's value head too: both variants then compute the same step
    actor: Any = load_actor(tc)
    if cfg.layers:
        actor.model.layers = actor.model.layers[: cfg.layers]
        actor.config.num_hidden_layers = cfg.layers
    learner = Learner(tc, actor, load_critic(tc, actor), pad)
    shortest = sorted(range(len(trajs)), key=lambda i: full.lengths[i])[:2]
    learner.train_step([trajs[i] for i in shortest])  # gradient buffers and moments now exist, libraries are set up
    Path("/proc/self/clear_refs").write_text("5")
    base_kib = _status_kib("VmRSS")
    t0 = time.perf_counter()
    m = learner.train_step(trajs)
    step_s = time.perf_counter() - t0
    peak_kib = _status_kib("VmHWM")
    real = sum(full.lengths)
    positions = sum(b.shape[0] * b.shape[1] for b in micro)
    return {
        "variant": variant,
        "micro_batch_tokens": tc.deepspeed.micro_batch_tokens,
        "micro_batches": len(micro),
        "largest_micro_batch_positions": max(b.shape[0] * b.shape[1] for b in micro),
        "real_tokens": real,
        "positions": positions,
        "padding_frac": 1.0 - real / positions,
        "step_s": step_s,
        "tokens_per_s": real / step_s,
        "trained_action_tokens": m.get("trained_tokens", 0.0),
        "peak_extra_bytes": (peak_kib - base_kib) * 1024,
        "peak_rss_bytes": peak_kib * 1024,
        "threads": torch.get_num_threads(),
        "metrics": {k: v for k, v in m.items() if k in ("pg_loss", "value_loss", "skipped_steps")},
    }


def measure(cfg: MicrobatchBenchConfig, variant: str) -> dict[str, Any]:
    """One variant in a fresh process (see the module docstring)."""
    payload = json.dumps({**asdict(cfg), "out": str(cfg.out), "trajectories": None})
    cmd = [sys.executable, "-m", "sao.benchmarks.bench_microbatch", variant, payload]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=cfg.timeout_s)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"bench microbatch: the {variant} step failed (exit {done.returncode}):\n{tail}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# -- the report ------------------------------------------------------------------------------------------------


def _plot(rows: list[dict[str, Any]], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        ("padding_frac", "padding fraction"),
        ("tokens_per_s", "real tokens / s of the step"),
        ("peak_extra_bytes", "peak RSS of the step, MiB"),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(12, 3.6))
    names = [r["variant"] for r in rows]
    for ax, (key, label) in zip(axes, panels, strict=True):
        vals = [r[key] / 2**20 if key == "peak_extra_bytes" else r[key] for r in rows]
        ax.bar(names, vals, color=["#c44", "#4a4"][: len(rows)])
        ax.set_title(label, fontsize=9)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _check(cfg: MicrobatchBenchConfig) -> None:
    if cfg.n < 2 or cfg.micro_batch_size < 1 or cfg.micro_batch_tokens < 1 or cfg.critic_steps < 1 or cfg.layers < 0:
        raise ValueError(
            "--n must be >= 2, --micro-batch-size, --micro-batch-tokens and --critic-steps >= 1, --layers >= 0"
        )
    if not 1 <= cfg.min_tokens <= cfg.max_tokens:
        raise ValueError(f"need 1 <= --min-tokens <= --max-tokens, got {cfg.min_tokens} and {cfg.max_tokens}")


def run(cfg: MicrobatchBenchConfig, echo: Callable[[str], None] = print, png: bool = True) -> dict[str, Any]:
    """Both variants one after another on one batch: a table, ``microbatch.json`` and ``microbatch.png``."""
    import os

    _check(cfg)
    cfg.out.mkdir(parents=True, exist_ok=True)
    trajs = load_batch(cfg)
    write_text_durably(cfg.out / "batch.jsonl", "".join(json.dumps(t.to_dict()) + "\n" for t in trajs))
    lengths = sorted(t.num_tokens for t in trajs)
    obs = sum(len(s.token_ids) for t in trajs for s in t.segments if s.kind == "observation")
    batch = {
        "source": str(cfg.trajectories) if cfg.trajectories else "synthetic SWE-style (SmolLM2 tokenizer)",
        "trajectories": len(trajs),
        "tokens_min": lengths[0],
        "tokens_median": lengths[len(lengths) // 2],
        "tokens_max": lengths[-1],
        "tokens_total": sum(lengths),
        "observation_share": obs / sum(lengths),
    }
    depth = f" (first {cfg.layers} layers)" if cfg.layers else ""
    load = os.getloadavg()
    echo(
        f"bench microbatch: {cfg.model}{depth}, {len(trajs)} trajectories of {lengths[0]}-{lengths[-1]} tokens (median "
        f"{batch['tokens_median']}, observations {batch['observation_share']:.0%}), micro_batch_size "
        f"{cfg.micro_batch_size}, budget {cfg.micro_batch_tokens} tokens, K={cfg.critic_steps}; load "
        f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    )
    rows: list[dict[str, Any]] = []
    for v in VARIANTS:
        echo(f"  running {v} ...")
        rows.append(measure(cfg, v))
    load_after = os.getloadavg()
    print_table(
        ["cut", "micro batches", "padding", "tokens/s", "step s", "peak RSS of the step (MiB)"],
        [
            [
                "row cut" if r["variant"] == "rows" else f"token budget {r['micro_batch_tokens']}",
                str(r["micro_batches"]),
                f"{r['padding_frac']:.1%}",
                f"{r['tokens_per_s']:.0f}",
                f"{r['step_s']:.1f}",
                f"{r['peak_extra_bytes'] / 2**20:.0f}",
            ]
            for r in rows
        ],
        echo,
    )
    rc, tk = rows
    speedup = tk["tokens_per_s"] / rc["tokens_per_s"]
    mem = tk["peak_extra_bytes"] / max(rc["peak_extra_bytes"], 1)
    same = {k: abs(tk["metrics"][k] - rc["metrics"][k]) for k in ("pg_loss", "value_loss") if k in rc["metrics"]}
    echo(f"  token budget / row cut: {speedup:.2f}x tokens/s, {mem:.2f}x peak memory; same step: |loss diff| {same}")
    result = {
        "config": {**asdict(cfg), "out": str(cfg.out), "trajectories": batch["source"]},
        "batch": batch,
        "variants": {r["variant"]: r for r in rows},
        "speedup_tokens_per_s": speedup,
        "peak_memory_ratio": mem,
        "loss_abs_diff": same,
        "load_avg_before": list(load),
        "load_avg_after": list(load_after),
        "memory_measure": "peak resident set (VmHWM) above the RSS just before the step",
    }
    path = cfg.out / "microbatch.json"
    write_json(path, result)
    if png:
        title = (
            f"{cfg.model}{depth}: {len(trajs)} trajectories, {lengths[0]}-{lengths[-1]} tokens; row cut of "
            f"{cfg.micro_batch_size} vs budget {cfg.micro_batch_tokens}"
        )
        _plot(rows, title, cfg.out / "microbatch.png")
    echo(f"wrote {path}")
    return result


if __name__ == "__main__":
    raw = json.loads(sys.argv[2])
    raw["out"] = Path(raw["out"])
    print(json.dumps(_child(MicrobatchBenchConfig(**raw), sys.argv[1])))
