"""`sao bench memory --mode learner`: the learner's training steps side by side per algorithm: cost and memory per step.

Each algorithm (``trainer.algorithm``: e.g. ``sao`` and ``running_mean``) runs in a fresh process on the main job's
learner settings (``configs/quickstart.yaml``: SmolLM2, 8 trajectories a step, micro batches of 4, K = 2 critic
steps on a frozen-attention critic) and trains ``steps`` steps of ``Learner.train_step`` on synthetic trajectories
shaped like the main job's (a ~160-token prompt, 3 turns of up to 48 action tokens with ~30-token tool outputs
between them; random token ids, rollout logprobs from the actor itself, rewards 0/1), or (``trajectories``) on a run's
own trajectories in their order (e.g. the levels job's RL ledger, whose rows are longer). No rollouts, engine or
sandbox: the learner's own cost, measured where its differences live. After each step the heap is trimmed as `sao train`
trims it (``trim=False`` shows what the trim holds back).

Per step: wall and CPU seconds (the process's; with ``threads=1`` one core's worth, which load on a shared machine
barely changes), the CPU of each phase (the critic's values, the advantages, the actor step(s), the K critic steps),
the resident set after the step and its peak during the step (``sao.core.memory``). The summary: CPU per trajectory
over the steps after the first (library set-up lands in the first) and each algorithm's ratio to ``baseline``.
"""

from __future__ import annotations

import functools
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# "values": the values phase, or (critic algorithms) the values phase fused with the first critic step (whose cost it
# then holds; "critic" holds the other K - 1); "advantages" is also counted inside a fused values phase
_PHASES = {
    "_critic_values": "values",
    "_values_with_critic_step": "values",
    "_advantages": "advantages",
    "_policy_steps": "actor",
    "_critic_steps": "critic",
}


@dataclass(frozen=True)
class LearnerBenchConfig:
    out: Path
    config: str = "configs/quickstart.yaml"
    model: str = "smollm2"
    algorithms: tuple[str, ...] = ("sao", "running_mean")
    baseline: str = "running_mean"
    steps: int = 4
    layers: int = 0  # keep the first N decoder layers (0 = all)
    threads: int = 1
    trim: bool = True
    overrides: tuple[str, ...] = field(default=())
    seed: int = 0
    timeout_s: float = 3600.0
    trajectories: str = ""
    """A run's trajectories (``RUN_DIR/NN_train/trajectories.jsonl``) to train on, ``batch`` at a time in their
    order, instead of synthetic ones (there must be ``steps * batch`` of them)."""


def _trajectories(model: Any, n: int, rng: random.Random) -> list[Any]:
    """``n`` main-job-shaped trajectories whose action logprobs are the model's own (the DIS ratio starts at 1)."""
    import torch

    from sao.agent.records import Segment, Trajectory
    from sao.trainer.algos.logprobs import token_logprobs

    vocab = int(model.get_output_embeddings().weight.shape[0])
    out = []
    for i in range(n):
        kinds = [("prompt", rng.randint(140, 180))]
        for turn in range(3):
            kinds.append(("action", rng.randint(16, 48)))
            if turn < 2:
                kinds.append(("observation", rng.randint(15, 45)))
        ids = [[rng.randrange(vocab) for _ in range(k)] for _, k in kinds]
        flat = torch.tensor([[t for seg in ids for t in seg]])
        with torch.no_grad():
            hidden = model(input_ids=flat, output_hidden_states=True, logits_to_keep=1).hidden_states[-1]
            lp, _ = token_logprobs(hidden, model.get_output_embeddings(), flat)
        reward = float(rng.random() < 0.5)
        segs, pos = [], 0
        for j, ((kind, k), toks) in enumerate(zip(kinds, ids, strict=True)):
            if kind == "action":  # the episode's reward on its last action token
                r = reward if j == len(kinds) - 1 else None
                segs.append(Segment("action", tuple(toks), tuple(lp[0, pos : pos + k].tolist()), 0, r))
            else:
                segs.append(Segment("prompt" if kind == "prompt" else "observation", tuple(toks)))
            pos += k
        out.append(Trajectory(f"bench-{i}", "bench", tuple(segs), reward, info={"solved": bool(reward)}))
    return out


def _batches(cfg: LearnerBenchConfig, actor: Any, batch: int, rng: random.Random) -> list[list[Any]]:
    """``cfg.steps`` batches of ``batch``: the file's trajectories in order, or synthetic ones."""
    if not cfg.trajectories:
        return [_trajectories(actor, batch, rng) for _ in range(cfg.steps)]
    from sao.trainer.learn.value_pretrain import read_rollouts

    trajs = read_rollouts(cfg.trajectories)
    need = cfg.steps * batch
    if len(trajs) < need:
        raise ValueError(
            f"--trajectories {cfg.trajectories}: {len(trajs)} trajectories with actions, {cfg.steps} steps of "
            f"{batch} need {need}; pass fewer --steps or a longer ledger"
        )
    return [trajs[i * batch : (i + 1) * batch] for i in range(cfg.steps)]


def _phase_cpu(learner_cls: Any, acc: dict[str, float]) -> None:
    """Wrap the learner's phases so each adds its CPU seconds (this thread's) to ``acc``."""
    for meth, label in _PHASES.items():
        fn = getattr(learner_cls, meth, None)
        if fn is None:  # a learner without that phase (an older one, measured for a before/after)
            continue

        def wrapper(self: Any, *a: Any, _fn: Any = fn, _label: str = label, **k: Any) -> Any:
            c0 = time.thread_time()
            try:
                return _fn(self, *a, **k)
            finally:
                acc[_label] = acc.get(_label, 0.0) + time.thread_time() - c0

        setattr(learner_cls, meth, functools.wraps(fn)(wrapper))


def _learner(cfg: LearnerBenchConfig, algorithm: str) -> tuple[Any, Any]:
    """The learner of ``cfg.config`` with ``algorithm`` (and the overrides), and its actor."""
    from sao.trainer import distributed
    from sao.trainer.config import load_config
    from sao.trainer.learn.learner import Learner
    from sao.trainer.learn.models import load_actor, load_critic

    # warm-up batches and stages are the run's, not a learner step's (and a critic-free algorithm refuses them)
    base = [f"model.path={cfg.model}", f"trainer.algorithm={algorithm}", "trainer.critic_warmup_steps=0", "stages=[]"]
    tc = load_config(cfg.config, [*base, *cfg.overrides])
    distributed.init_distributed()
    actor: Any = load_actor(tc)
    if cfg.layers:
        actor.model.layers = actor.model.layers[: cfg.layers]
        actor.config.num_hidden_layers = cfg.layers
    critic = load_critic(tc, actor) if tc.uses_critic else None
    return Learner(tc, actor, critic, pad_token_id=0), actor


def _child(cfg: LearnerBenchConfig, algorithm: str) -> dict[str, Any]:
    """Runs in a fresh process: ``cfg.steps`` learner steps of ``algorithm``; one record per step."""
    import torch

    from sao.core import memory
    from sao.trainer.learn.learner import Learner

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    learner, actor = _learner(cfg, algorithm)
    batch = learner.cfg.trainer.batch_size
    rng = random.Random(cfg.seed)
    batches = _batches(cfg, actor, batch, rng)  # the same batches for every algorithm
    acc: dict[str, float] = {}
    _phase_cpu(Learner, acc)
    memory.trim_heap()
    memory.take_peak_rss()
    rows = []
    for step, trajs in enumerate(batches):
        acc.clear()
        t0, c0 = time.perf_counter(), time.process_time()
        m = learner.train_step(trajs)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if cfg.trim:
            memory.trim_heap()
        rows.append({
            "step": step, "wall_s": wall, "cpu_s": cpu, **{f"cpu_{k}_s": v for k, v in acc.items()},
            "rss_bytes": memory.rss_bytes(), "peak_rss_bytes": memory.take_peak_rss(),
            "trained_tokens": m.get("trained_tokens", 0.0), "load_avg_1m": os.getloadavg()[0],
        })  # fmt: skip
    return {"algorithm": algorithm, "batch": batch, "threads": torch.get_num_threads(), "steps": rows}


def measure(cfg: LearnerBenchConfig, algorithm: str) -> dict[str, Any]:
    """One algorithm's steps in a fresh process (see the module docstring)."""
    payload = json.dumps({**asdict(cfg), "out": str(cfg.out)})
    cmd = [sys.executable, "-m", "sao.benchmarks.learner_steps", algorithm, payload]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=cfg.timeout_s)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"bench memory --mode learner: {algorithm} failed (exit {done.returncode}):\n{tail}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def summarize(res: dict[str, Any]) -> dict[str, float]:
    """CPU and wall per step and per trajectory (steps after the first), and the resident set's growth per step."""
    rows = res["steps"]
    steady = rows[1:] or rows
    cpu = statistics.median(r["cpu_s"] for r in steady)
    rss = [r["rss_bytes"] for r in rows]
    out = {
        "cpu_s_per_step": cpu,
        "cpu_s_per_traj": cpu / res["batch"],
        "wall_s_per_step": statistics.median(r["wall_s"] for r in steady),
        "rss_growth_bytes_per_step": (rss[-1] - rss[1]) / max(len(rss) - 2, 1) if len(rss) > 2 else 0.0,
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in rows),
    }
    for key in ("cpu_values_s", "cpu_advantages_s", "cpu_actor_s", "cpu_critic_s"):
        out[key] = statistics.median(r.get(key, 0.0) for r in steady)
    return out


def run(cfg: LearnerBenchConfig, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Each algorithm in turn; a table of cost and memory per step, ratios to the baseline; ``learner_steps.json``."""
    from sao.core.jsonl import write_text_durably

    if cfg.steps < 2 or cfg.threads < 1 or cfg.layers < 0:
        raise ValueError("steps must be >= 2 (the first is set-up), threads >= 1, layers >= 0")
    cfg.out.mkdir(parents=True, exist_ok=True)
    depth = f", first {cfg.layers} layers" if cfg.layers else ""
    echo(f"learner steps of {cfg.config} on {cfg.model}{depth}, {cfg.threads} thread(s), trim {cfg.trim}; "
         f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    results: dict[str, Any] = {}
    for algo in cfg.algorithms:
        echo(f"  running {algo} ({cfg.steps} steps) ...")
        res = measure(cfg, algo)
        res["summary"] = s = summarize(res)
        results[algo] = res
        gib = [f"{r['rss_bytes'] / 2**30:.2f}" for r in res["steps"]]
        echo(f"  {algo:14s} CPU {s['cpu_s_per_step']:6.1f} s/step = {s['cpu_s_per_traj']:5.2f} s/trajectory "
             f"(values {s['cpu_values_s']:.1f}, actor {s['cpu_actor_s']:.1f}, critic {s['cpu_critic_s']:.1f}); "
             f"RSS after each step {' '.join(gib)} GiB, peak {s['peak_rss_bytes'] / 2**30:.2f} GiB")  # fmt: skip
    base = results.get(cfg.baseline, {}).get("summary", {}).get("cpu_s_per_traj")
    for algo, res in results.items():
        if base:
            res["summary"]["cpu_ratio_to_baseline"] = res["summary"]["cpu_s_per_traj"] / base
            echo(f"  {algo} / {cfg.baseline}: {res['summary']['cpu_ratio_to_baseline']:.2f}x CPU per trajectory")
    doc = {"config": {**asdict(cfg), "out": str(cfg.out)}, "load_avg_end": os.getloadavg()[0], "results": results}
    path = cfg.out / "learner_steps.json"
    write_text_durably(path, json.dumps(doc, indent=2))
    echo(f"wrote {path}")
    return doc


if __name__ == "__main__":
    raw = json.loads(sys.argv[2])
    raw["out"] = Path(raw["out"])
    raw["algorithms"], raw["overrides"] = tuple(raw["algorithms"]), tuple(raw["overrides"])
    print(json.dumps(_child(LearnerBenchConfig(**raw), sys.argv[1])))
