"""`scripts/gpu_check.sh`'s measurements: one SAO learner step of a dense and an MoE model on one GPU (bf16, ZeRO 0).

For each model (random init, built in memory by ``sao.trainer.learn.models.load_actor`` from a ``tiny:*`` config
enlarged with ``model.tiny_overrides``; no weights travel):

- peak memory of one actor forward + backward at each sequence length with full-vocabulary logprobs (``naive``), the
  learner's chunked ones (``chunked``) and none (``backbone``, the floor), by
  ``sao.benchmarks.bench_memory.actor_step``;
- the critic value head's dtype before and after ``deepspeed.initialize`` (the head is built float32 on purpose);
- one ``Learner.train_step`` (algorithm ``sao``: critic values -> skip-observation GAE -> DIS actor step -> K = 2 critic
  steps with frozen attention) on one trajectory of each length, after a short warm-up step, with the phases timed by
  ``sao.benchmarks.throughput_probe.time_learner_phases``; tokens/s, model FLOP/s and MFU against the bf16 matmul rate
  measured first in the same process, and the step's peak memory.

``--cpu`` runs the same code on this machine's CPU (the default tiny models, short sequences): a dry run that keeps
the script working between GPU runs. Results go to ``OUT/bench.json`` after every measurement, so a run cut by its
time limit still leaves what it measured; ``sao.benchmarks.gpu_check_report`` turns them into the table.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import random
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sao.benchmarks.gpu_check_flops import FlopShape, step_flops
from sao.core.jsonl import write_text_durably

QWEN_VOCAB = 151936  # Qwen2/3's vocabulary: what makes full-vocabulary logprobs big
GPU_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    # ~357M parameters (156M of them the tied embedding): the shape of a small Qwen3/Llama
    "dense": (
        "tiny:llama",
        dict(vocab_size=QWEN_VOCAB, hidden_size=1024, intermediate_size=3072, num_hidden_layers=16,
             num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=40960),
    ),
    # ~640M parameters, 32 experts with 4 active: a Qwen3-30B-A3B in miniature
    "moe": (
        "tiny:moe",
        dict(vocab_size=QWEN_VOCAB, hidden_size=1024, moe_intermediate_size=384,
             num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=4, head_dim=64, num_experts=32,
             num_experts_per_tok=4, max_position_embeddings=40960),
    ),
}  # fmt: skip
# the tiny test models with a smaller vocabulary: the dry run checks the code path, in well under a minute of CPU
CPU_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "dense": ("tiny:llama", {"vocab_size": 8192}),
    "moe": ("tiny:moe", {"vocab_size": 8192}),
}
MEMORY_VARIANTS = ("naive", "chunked", "backbone")
CRITIC_UPDATES = 2


@dataclass(frozen=True)
class CheckConfig:
    out: Path
    cpu: bool = False
    lengths: tuple[int, ...] = (8192, 32768)
    warmup_len: int = 1024
    repeats: int = 2
    budget_s: float = 240.0
    models: tuple[str, ...] = ("dense", "moe")

    @staticmethod
    def for_mode(out: Path, cpu: bool, budget_s: float) -> CheckConfig:
        if cpu:
            return CheckConfig(out, cpu=True, lengths=(128, 256), warmup_len=32, repeats=1, budget_s=budget_s)
        return CheckConfig(out, budget_s=budget_s)


# -- measurements ----------------------------------------------------------------------------------------------


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_tflops(device: Any, cpu: bool) -> dict[str, Any]:
    """The bf16 matmul rate of this device: an ``n x n x n`` product, mean of ``iters`` after 3 warm-ups."""
    import torch

    n, iters = (512, 3) if cpu else (8192, 10)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        a @ b
    _sync(device)
    dt = (time.perf_counter() - t0) / iters
    return {"n": n, "iters": iters, "dtype": "bfloat16", "tflops": 2 * n**3 / dt / 1e12}


def _status_kib(name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{name} not in /proc/self/status")


def peak_bytes(fn: Callable[[], Any], device: Any) -> tuple[Any, int, int]:
    """``(fn's result, peak above the memory in use before, peak in use)``: CUDA's allocator statistics on a GPU;
    the resident high-water mark on CPU (coarse: freed heap the allocator keeps counts too)."""
    import torch

    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        out = fn()
        _sync(device)
        peak = torch.cuda.max_memory_allocated(device)
        return out, peak - base, peak
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident size
    base = _status_kib("VmRSS") * 1024
    out = fn()
    peak = _status_kib("VmHWM") * 1024
    return out, max(peak - base, 0), peak


def _free(device: Any) -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _is_oom(e: BaseException) -> bool:
    import torch

    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


def logprob_memory(model: Any, lengths: tuple[int, ...], device: Any) -> list[dict[str, Any]]:
    """Per length, the peak extra memory (bytes, or "OOM") of one actor forward + backward of each variant of
    ``MEMORY_VARIANTS``, chunked as the learner chunks."""
    import torch

    from sao.benchmarks.bench_memory import actor_step
    from sao.trainer.learn.learner import LOGPROB_CHUNK_TOKENS

    vocab = model.get_output_embeddings().weight.shape[0]
    rows: list[dict[str, Any]] = []
    for t in lengths:
        g = torch.Generator().manual_seed(t)
        ids = torch.randint(0, vocab, (1, t), generator=g).to(device)
        mask = (torch.rand(1, t, generator=g) < 0.6).to(device)
        mask[:, 0] = False
        row: dict[str, Any] = {"tokens": t}
        for variant in MEMORY_VARIANTS:
            try:
                _, row[variant], _ = peak_bytes(
                    functools.partial(actor_step, model, ids, mask, variant, LOGPROB_CHUNK_TOKENS), device
                )
            except Exception as e:
                if not _is_oom(e):
                    raise
                row[variant] = "OOM"
            model.zero_grad(set_to_none=True)
            _free(device)
        rows.append(row)
    return rows


def trajectory(model: Any, tokens: int, seed: int, device: Any) -> Any:
    """One 4-turn trajectory of ``tokens`` random tokens (1/8 prompt, then per turn 60% action and 40% observation,
    the last turn all action) whose rollout logprobs are ``model``'s own (the DIS ratios start at 1), with a 0/1
    reward per turn on its last action token."""
    import torch

    from sao.agent.records import Segment, Trajectory
    from sao.trainer.algos.logprobs import token_logprobs

    rng = random.Random(seed)
    vocab = model.get_output_embeddings().weight.shape[0]
    prompt, turns = tokens // 8, 4
    per_turn = (tokens - prompt) // turns
    kinds: list[tuple[str, int]] = [("prompt", prompt)]
    for i in range(turns):
        last = i == turns - 1
        n = tokens - prompt - per_turn * (turns - 1) if last else per_turn
        act = n if last else (n * 3) // 5
        kinds += [("action", act), ("observation", n - act)] if not last else [("action", act)]
    ids = [rng.randrange(vocab) for _ in range(tokens)]
    flat = torch.tensor([ids], device=device)
    with torch.no_grad():
        hidden = model(input_ids=flat, output_hidden_states=True, logits_to_keep=1).hidden_states[-1]
        lp = token_logprobs(hidden, model.get_output_embeddings(), flat)[0][0].float().cpu().tolist()
    segs, pos = [], 0
    for kind, n in kinds:
        toks = ids[pos : pos + n]
        if kind == "action":
            segs.append(Segment("action", tuple(toks), tuple(lp[pos : pos + n]), 0, float(rng.random() < 0.5)))
        else:
            segs.append(Segment("prompt" if kind == "prompt" else "observation", tuple(toks)))
        pos += n
    return Trajectory(f"gpu-check-{tokens}", "gpu_check", tuple(segs), sum(s.reward or 0.0 for s in segs))


def sao_config(model_path: str, overrides: dict[str, Any]) -> Any:
    """SAO with K = 2 critic steps and a frozen-attention critic, bf16 DeepSpeed at ZeRO 0, one sequence a batch."""
    from sao.trainer.config import config_from_dict

    return config_from_dict(
        {
            "model": {"path": model_path, "tiny_overrides": overrides, "dtype": "bfloat16"},
            "trainer": {"algorithm": "sao", "batch_size": 1, "lr": 1e-6, "critic_updates_per_step": CRITIC_UPDATES},
            "critic": {"lr": 1e-6, "freeze_attention": True},
            "deepspeed": {"zero_stage": 0, "bf16": True, "micro_batch_size": 1},
        }
    )


def with_torch_adam(ds_config: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """``sao.trainer.learn.deepspeed_engine.ds_config`` with DeepSpeed told to step a torch AdamW: the fallback when its
    fused Adam op cannot be JIT-built on the GPU machine, so the step can still be timed (and the failure is
    reported)."""

    @functools.wraps(ds_config)
    def conf(*a: Any, **k: Any) -> dict[str, Any]:
        out = ds_config(*a, **k)
        if "optimizer" in out:
            out["optimizer"]["params"]["torch_adam"] = True
        return out

    return conf


def _optimizer_name(engine: Any) -> str:
    return type(getattr(engine, "basic_optimizer", None) or engine.optimizer).__name__


def make_learner(cfg: Any, actor: Any, critic: Any, rec: dict[str, Any]) -> Any:
    """The project's learner; if DeepSpeed's fused Adam op fails to build, again with a torch AdamW (recorded)."""
    import sao.trainer.learn.deepspeed_engine
    from sao.trainer.learn.learner import Learner

    try:
        learner = Learner(cfg, actor, critic, pad_token_id=0)
    except Exception as e:
        if "fused_adam" not in traceback.format_exc().lower().replace("fusedadam", "fused_adam"):
            raise
        rec["optimizer_error"] = f"{type(e).__name__}: {e}"[:1000]
        original = sao.trainer.learn.deepspeed_engine.ds_config
        sao.trainer.learn.deepspeed_engine.ds_config = with_torch_adam(original)
        try:
            learner = Learner(cfg, actor, critic, pad_token_id=0)
        finally:
            sao.trainer.learn.deepspeed_engine.ds_config = original
    rec["optimizer"] = _optimizer_name(learner.actor)
    return learner


def _time_for(t: int, steps: list[dict[str, Any]], left: float, repeats: int) -> bool:
    """Whether ``repeats`` steps at length ``t`` (and the forward that makes its trajectory) likely fit in ``left``
    seconds, judged from the last step measured (as if all of it grew with the square of the length, as attention
    does: an overestimate that leaves time for the next model)."""
    done = [s for s in steps if "step_s" in s]
    if not done:
        return left > 5
    prev = done[-1]
    return bool(left > (repeats + 1) * prev["step_s"] * (t / prev["tokens"]) ** 2 + 5)


def sao_steps(learner: Any, check: CheckConfig, device: Any, t_end: float, peak_tflops: float,
              rec: dict[str, Any], save: Callable[[], None]) -> None:  # fmt: skip
    """A warm-up step, then ``repeats`` timed steps per length (the fastest kept), appended to ``rec["steps"]``."""
    shape = FlopShape.of(learner.actor.module.config)
    k = learner.cfg.trainer.critic_updates_per_step
    learner.train_step([trajectory(learner.actor.module, check.warmup_len, 0, device)])
    for t in check.lengths:
        left = t_end - time.monotonic()
        if not _time_for(t, rec["steps"], left, check.repeats):
            rec["steps"].append({"tokens": t, "skipped": f"time budget ({left:.0f} s left)"})
            save()
            continue
        traj = trajectory(learner.actor.module, t, t, device)
        action = sum(len(s.token_ids) for s in traj.action_segments)
        best: dict[str, Any] = {"tokens": t, "skipped": "no repeat ran"}
        for _ in range(check.repeats):
            try:
                m, _, peak = peak_bytes(functools.partial(learner.train_step, [traj]), device)
            except Exception as e:
                if not _is_oom(e):
                    raise
                best = {"tokens": t, "skipped": "OOM"}
                _free(device)
                break
            if "step_s" not in best or m["time_learner_s"] < best["step_s"]:
                best = {
                    "tokens": t, "action_tokens": action, "step_s": m["time_learner_s"], "peak_bytes": peak,
                    "phases_s": {p: m[f"time_{p}_s"] for p in ("values", "actor", "critic")},
                    "metrics": {x: m[x] for x in ("trained_tokens", "value_loss", "skipped_steps",
                                                  "critic_skipped_steps", "actor_grad_norm") if x in m},
                }  # fmt: skip
        if "step_s" in best:
            fl = step_flops(shape, t, action, k)
            best["phases_s"]["other"] = max(best["step_s"] - sum(best["phases_s"].values()), 0.0)
            best["tflop"] = sum(fl.values()) / 1e12
            best["tokens_per_s"] = t / best["step_s"]
            best["mfu"] = best["tflop"] / best["step_s"] / peak_tflops
            best["phase_mfu"] = {p: fl[p] / 1e12 / max(best["phases_s"][p], 1e-9) / peak_tflops for p in fl}
        rec["steps"].append(best)
        save()


def values_bf16_rounded(critic: Any, device: Any) -> bool:
    """Whether the critic's values (float32 tensors) hold only bfloat16 numbers: true when its head computes in
    bfloat16, whatever the head's storage dtype; float32 values of a float32 head almost never all are."""
    import torch

    vocab = critic.module.config.vocab_size
    ids = torch.randint(0, vocab, (1, 64), generator=torch.Generator().manual_seed(0)).to(device)
    with torch.no_grad():
        v = critic(ids, torch.ones_like(ids)).float()
    return bool(torch.equal(v, v.to(torch.bfloat16).float()))


def check_model(name: str, check: CheckConfig, device: Any, t_end: float, peak_tflops: float, rec: dict[str, Any],
                save: Callable[[], None]) -> None:  # fmt: skip
    """Build one actor + critic, then measure its logprob memory, the head's dtype and its SAO steps into ``rec``."""
    from sao.trainer.learn.models import load_actor, load_critic

    path, overrides = (CPU_MODELS if check.cpu else GPU_MODELS)[name]
    cfg = sao_config(path, overrides)
    t0 = time.monotonic()
    actor = load_actor(cfg)
    critic = load_critic(cfg, actor)
    rec.update(params=sum(p.numel() for p in actor.parameters()), config={"path": path, **overrides})
    rec["critic_head_dtype_before"] = str(critic.value_head.weight.dtype).replace("torch.", "")
    rec["build_s"] = time.monotonic() - t0
    actor.to(device)
    rec["logprob_memory"] = logprob_memory(actor, check.lengths, device)
    save()
    learner = make_learner(cfg, actor, critic, rec)
    assert learner.critic is not None
    rec["critic_head_dtype"] = str(learner.critic.module.value_head.weight.dtype).replace("torch.", "")
    rec["critic_values_bf16_rounded"] = values_bf16_rounded(learner.critic, device)
    save()
    sao_steps(learner, check, device, t_end, peak_tflops, rec, save)


def run(check: CheckConfig, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Every measurement, in order of value (the matmul rate, then the dense model, then the MoE one)."""
    import deepspeed
    import torch
    import transformers

    from sao.benchmarks.throughput_probe import time_learner_phases
    from sao.trainer import distributed

    t0 = time.monotonic()
    t_end = t0 + check.budget_s
    if not check.cpu and not torch.cuda.is_available():
        raise SystemExit("gpu check: no CUDA device here; on a CPU machine run `bash scripts/gpu_check.sh --cpu`")
    distributed.init_distributed()
    device = distributed.device()
    time_learner_phases()
    res: dict[str, Any] = {
        "mode": "cpu" if check.cpu else "gpu",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "versions": {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "transformers": transformers.__version__,
            "deepspeed": deepspeed.__version__,
        },
        "lengths": list(check.lengths),
        "critic_updates_per_step": CRITIC_UPDATES,
        "models": {},
    }
    check.out.mkdir(parents=True, exist_ok=True)
    path = check.out / "bench.json"

    def save() -> None:
        write_text_durably(path, json.dumps(res, indent=2))

    res["matmul"] = matmul_tflops(device, check.cpu)
    echo(f"bf16 matmul {res['matmul']['n']}^3: {res['matmul']['tflops']:.3g} TFLOP/s")
    save()
    for name in check.models:
        rec: dict[str, Any] = {"steps": []}
        res["models"][name] = rec
        if time.monotonic() > t_end - 10:
            rec["error"] = "skipped: time budget"
            continue
        echo(f"{name}: building and measuring ({time.monotonic() - t0:.0f} s in) ...")
        try:
            check_model(name, check, device, t_end, res["matmul"]["tflops"], rec, save)
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {e}"[:2000]
            echo(traceback.format_exc())
        _free(device)
        for s in rec["steps"]:
            echo(
                f"  {name} T={s['tokens']}: "
                + (f"{s['step_s']:.3f} s, MFU {s['mfu']:.3f}" if "step_s" in s else s["skipped"])
            )
        save()
    echo(f"bench done in {time.monotonic() - t0:.0f} s: {path}")
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cpu", action="store_true", help="a dry run on CPU: tiny models, short sequences")
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop starting measurements after this")
    a = ap.parse_args(argv)
    run(CheckConfig.for_mode(a.out, a.cpu, a.budget_s))


if __name__ == "__main__":
    main()
