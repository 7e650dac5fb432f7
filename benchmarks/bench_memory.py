"""`sao bench memory`: peak memory of one actor step (forward + backward of the policy loss), naive vs chunked logprobs.
(``--mode learner``: whole learner steps per algorithm, CPU and resident set per step: ``learner_steps.py``.)

One actor step here is what the learner does per micro-batch: the model forward, token logprobs and entropy of
the sequence, a DIS-shaped loss on the action tokens with an entropy bonus (so the entropy carries a gradient),
and the backward pass. The optimizer step is left out (it is the same for both variants).

- ``naive``: the model's full logits ``[B, T, V]``, then log-softmax and probabilities over the whole vocabulary,
  as the learner did before ``trainer/algos/logprobs.py``;
- ``chunked``: the final hidden states, projected and reduced ``chunk_tokens`` rows at a time, recomputed in
  backward (``sao.trainer.algos.logprobs.token_logprobs``);
- ``backbone``: the hidden states only (a loss on them, no LM head): the floor both variants share.

Each variant runs in a fresh process: after a short warm-up step (library set-up is not the step's memory) the
resident high-water mark is reset (``/proc/self/clear_refs``) and the peak above the resident level before the
step is read from ``/proc/self/status`` (VmHWM), with glibc told to return freed blocks so resident memory tracks
live memory. Model weights and gradient buffers allocated in the warm-up are therefore not counted; activations,
logits and the step's temporaries are.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sao.core.jsonl import write_text_durably

VARIANTS = ("naive", "chunked", "backbone")


@dataclass(frozen=True)
class MemoryBenchConfig:
    out: Path
    model: str = "smollm2"  # a model dir, the smollm2 alias or tiny:llama / tiny:moe
    seq_len: int = 8192
    batch: int = 1
    chunk_tokens: int = 1024
    layers: int = 0  # keep the first N decoder layers (0 = all); the logits part does not depend on depth
    dtype: str = "float32"
    gradient_checkpointing: bool = True
    action_frac: float = 0.6
    variants: tuple[str, ...] = field(default=VARIANTS)
    threads: int = 0
    timeout_s: float = 3600.0


def _status_kib(name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{name} not in /proc/self/status")


def _load(cfg: MemoryBenchConfig) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    from sao.core.paths import resolve_model_path

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.dtype]
    path = resolve_model_path(cfg.model)
    if path.startswith("tiny:"):
        from sao.core.tiny_models import build_tiny_model

        model = build_tiny_model(path.split(":", 1)[1], seed=0, max_position_embeddings=max(cfg.seq_len, 2048))
    else:
        if not Path(path).is_dir():
            raise FileNotFoundError(f"model {cfg.model!r}: no directory {path}; run `bash scripts/setup.sh` first")
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    if cfg.layers:
        model.model.layers = model.model.layers[: cfg.layers]
        model.config.num_hidden_layers = cfg.layers
    model = model.to(dtype)
    model.config.use_cache = False
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    return model


def actor_step(model: Any, ids: Any, action_mask: Any, variant: str, chunk_tokens: int) -> dict[str, float]:
    """Forward, logprobs + entropy (with gradient), a DIS-shaped loss with an entropy bonus, backward."""
    import torch

    from sao.trainer.algos.logprobs import chunk_logprobs, token_logprobs

    g = torch.Generator().manual_seed(1)
    adv = torch.randn(ids.shape, generator=g).to(ids.device)  # the generator is a CPU one; ids may be on CUDA
    n = action_mask.sum().clamp(min=1)
    if variant == "backbone":
        out = model.model(input_ids=ids)
        loss = out.last_hidden_state.float().pow(2).mean()
        loss.backward()
        return {"loss": float(loss)}
    if variant == "naive":
        logits = model(input_ids=ids).logits
        b, t, v = logits.shape
        lp_flat, ent_flat = chunk_logprobs(
            logits[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1), with_entropy=True, entropy_grad=True
        )
        assert ent_flat is not None
        logp = torch.nn.functional.pad(lp_flat.view(b, t - 1), (1, 0))
        ent = torch.nn.functional.pad(ent_flat.view(b, t - 1), (1, 0))
    else:
        out = model(input_ids=ids, output_hidden_states=True, logits_to_keep=1)
        lp_c, ent_c = token_logprobs(
            out.hidden_states[-1], model.get_output_embeddings(), ids, with_entropy=True, entropy_grad=True,
            chunk_tokens=chunk_tokens, positions=action_mask,
        )  # fmt: skip
        assert ent_c is not None
        logp, ent = lp_c, ent_c
    mask = action_mask.float()
    loss = -(adv * logp * mask).sum() / n - 0.01 * (ent * mask).sum() / n
    loss.backward()
    return {
        "loss": float(loss),
        "logp_mean": float((logp.detach() * mask).sum() / n),
        "entropy_mean": float((ent.detach() * mask).sum() / n),
        "head_grad_norm": float(model.get_output_embeddings().weight.grad.norm()),
    }


def _inputs(cfg: MemoryBenchConfig, seq_len: int, vocab: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (cfg.batch, seq_len), generator=g)
    mask = torch.rand(cfg.batch, seq_len, generator=g) < cfg.action_frac
    mask[:, 0] = False
    return ids, mask


def _child(cfg: MemoryBenchConfig, variant: str) -> dict[str, Any]:
    """Runs in a fresh process: one warm-up step, then the measured step; returns its peak and timings."""
    import torch

    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD: big blocks get their own mapping, unmapped on free
    libc.mallopt(-1, 0)  # M_TRIM_THRESHOLD
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    model = _load(cfg)
    load_s = time.perf_counter() - t0
    vocab = model.get_output_embeddings().weight.shape[0]
    ids, mask = _inputs(cfg, 64, vocab)
    actor_step(model, ids, mask, variant, cfg.chunk_tokens)  # gradient buffers now exist, libraries are set up
    ids, mask = _inputs(cfg, cfg.seq_len, vocab)
    Path("/proc/self/clear_refs").write_text("5")
    base_kib = _status_kib("VmRSS")
    t0 = time.perf_counter()
    res = actor_step(model, ids, mask, variant, cfg.chunk_tokens)
    step_s = time.perf_counter() - t0
    peak_kib = _status_kib("VmHWM")
    return {
        **res,
        "variant": variant,
        "peak_extra_bytes": (peak_kib - base_kib) * 1024,
        "rss_before_bytes": base_kib * 1024,
        "peak_rss_bytes": peak_kib * 1024,
        "step_s": step_s,
        "load_s": load_s,
        "vocab": vocab,
        "params": sum(p.numel() for p in model.parameters()),
        "layers": len(model.model.layers),
        "threads": torch.get_num_threads(),
    }


def measure(cfg: MemoryBenchConfig, variant: str) -> dict[str, Any]:
    """One variant in a fresh process (see the module docstring)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    payload = json.dumps({**asdict(cfg), "out": str(cfg.out), "variants": list(cfg.variants)})
    cmd = [sys.executable, "-m", "sao.benchmarks.bench_memory", variant, payload]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=cfg.timeout_s)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"bench memory: the {variant} step failed (exit {done.returncode}):\n{tail}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _mib(x: float) -> str:
    return f"{x / 2**20:9.1f}"


def _plot(rows: list[dict[str, Any]], cfg: MemoryBenchConfig, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = [r["variant"] for r in rows]
    ax.bar(names, [r["peak_extra_bytes"] / 2**20 for r in rows], color=["#c44", "#4a4", "#888"][: len(rows)])
    ax.set_ylabel("peak memory of one actor step, MiB")
    depth = f", first {cfg.layers} layers" if cfg.layers else ""
    ax.set_title(f"{cfg.model}{depth}, T={cfg.seq_len}, B={cfg.batch}, chunk {cfg.chunk_tokens}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(cfg: MemoryBenchConfig, echo: Callable[[str], None] = print, png: bool = True) -> dict[str, Any]:
    """Run the variants one after another, print a side-by-side table, write ``memory.json`` (and a PNG)."""
    for v in cfg.variants:
        if v not in VARIANTS:
            raise ValueError(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    if cfg.seq_len < 2 or cfg.batch < 1 or cfg.chunk_tokens < 1 or cfg.layers < 0:
        raise ValueError("seq_len must be >= 2, batch and chunk_tokens >= 1, layers >= 0")
    if cfg.dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be float32 or bfloat16, got {cfg.dtype!r}")
    cfg.out.mkdir(parents=True, exist_ok=True)
    echo(
        f"one actor step, {cfg.model} ({cfg.dtype}{f', first {cfg.layers} layers' if cfg.layers else ''}), "
        f"B={cfg.batch} T={cfg.seq_len}, chunk {cfg.chunk_tokens}, "
        f"gradient checkpointing {'on' if cfg.gradient_checkpointing else 'off'}; a fresh process per variant"
    )
    rows: dict[str, dict[str, Any]] = {}
    for v in cfg.variants:
        echo(f"  running {v} ...")
        rows[v] = r = measure(cfg, v)
        echo(
            f"  {v:9s} peak extra {_mib(r['peak_extra_bytes'])} MiB  (process peak RSS {_mib(r['peak_rss_bytes'])} "
            f"MiB)  step {r['step_s']:.1f} s"
        )
    result: dict[str, Any] = {"config": {**asdict(cfg), "out": str(cfg.out)}, "variants": rows}
    if "naive" in rows and "chunked" in rows:
        n, c = rows["naive"], rows["chunked"]
        ratio = c["peak_extra_bytes"] / max(n["peak_extra_bytes"], 1)
        result["ratio_chunked_to_naive"] = ratio
        result["logp_mean_abs_diff"] = abs(n["logp_mean"] - c["logp_mean"])
        result["head_grad_norm_rel_diff"] = abs(n["head_grad_norm"] - c["head_grad_norm"]) / max(
            n["head_grad_norm"], 1e-30
        )
        echo(f"  chunked / naive peak: {ratio:.3f}  (goal <= 0.25: {'met' if ratio <= 0.25 else 'NOT met'})")
        if "backbone" in rows:
            floor = rows["backbone"]["peak_extra_bytes"]
            head_n, head_c = n["peak_extra_bytes"] - floor, c["peak_extra_bytes"] - floor
            result["logprob_part_bytes"] = {"naive": head_n, "chunked": head_c}
            echo(f"  above the backbone-only step: naive {_mib(head_n)} MiB, chunked {_mib(head_c)} MiB")
        echo(
            f"  same step: |mean logp diff| {result['logp_mean_abs_diff']:.2e}, lm_head grad norm rel diff "
            f"{result['head_grad_norm_rel_diff']:.2e}"
        )
    path = cfg.out / "memory.json"
    write_text_durably(path, json.dumps(result, indent=2))
    if png and rows:
        _plot(list(rows.values()), cfg, cfg.out / "memory.png")
    echo(f"wrote {path}")
    return result


if __name__ == "__main__":
    raw = json.loads(sys.argv[2])
    raw["out"], raw["variants"] = Path(raw["out"]), tuple(raw["variants"])
    print(json.dumps(_child(MemoryBenchConfig(**raw), sys.argv[1])))
