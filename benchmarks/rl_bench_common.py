"""Shared parts of the RL benchmarks: a word-level tokenizer for tiny models, config files, in-process runs, stats.

Why a word-level tokenizer: a tiny random-init model with SmolLM2's 49k-token vocabulary spends nearly all of a
training step on the output layer (logits of every position over 49k tokens), ~15 s per step on 2 cores. The
benchmarks measure the pipeline and the algorithms, not a vocabulary projection, so they give the tiny model a
vocabulary made of the words its env can print (a ChatML template, ~50 tokens): a step then takes well under a
second while every other part (agent, engine, coordinator, DeepSpeed learner, weight sync) is the real one.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sao.core.config import merge
from sao.core.jsonl import write_json_atomic, write_text_durably, write_yaml_atomic

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPEC_HINT = "pass --config with a file from configs/bench/"
SPECIAL = ("<pad>", "<unk>", "<|im_start|>", "<|im_end|>")


def env_texts(env_id: str, kwargs: dict[str, Any], episodes: int = 40, action: str = "A") -> list[str]:
    """Every text an env shows in ``episodes`` seeded episodes (prompts, observations, system prompt)."""
    import gymnasium

    import sao.envs  # noqa: F401 - registers the sao/ envs

    texts: list[str] = []
    for seed in range(episodes):
        env: Any = gymnasium.make(env_id, **kwargs).unwrapped
        try:
            obs, info = env.reset(seed=seed)
            texts += [obs, str(info.get("system_prompt") or "")]
            done = False
            while not done:
                obs, _, term, trunc, _ = env.step(action)
                texts.append(obs)
                done = term or trunc
        finally:
            env.close()
    return texts


def build_word_tokenizer(out_dir: Path, texts: Iterable[str], words: Iterable[str] = ()) -> Path:
    """A ChatML word-level tokenizer whose vocabulary is the words of ``texts`` plus ``words``; saved to
    ``out_dir`` (HF format). Unknown words map to ``<unk>``; decoding joins words with spaces."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pre = pre_tokenizers.Whitespace()
    vocab: dict[str, int] = {tok: i for i, tok in enumerate(SPECIAL)}
    for text in [*texts, "system user assistant tool", " ".join(words)]:
        for word, _ in pre.pre_tokenize_str(text):
            vocab.setdefault(word, len(vocab))
    for word in words:
        vocab.setdefault(word, len(vocab))  # a word the pre-tokenizer would split still gets its own id
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=core,
        unk_token="<unk>",
        pad_token="<pad>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=CHATML_TEMPLATE,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    return out_dir


def word_tokenizer(out_dir: Path, texts: Iterable[str], words: Iterable[str] = ()) -> tuple[Path, int]:
    """``build_word_tokenizer`` plus the tiny model's vocabulary size for it (rounded up to a multiple of 8)."""
    from transformers import AutoTokenizer

    path = build_word_tokenizer(out_dir, texts, words)
    return path, int(math.ceil(len(AutoTokenizer.from_pretrained(str(path))) / 8) * 8)


def bench_run_config(
    base: dict[str, Any], extra: dict[str, Any], seed: int, steps: int, tokenizer: Path, vocab: int
) -> dict[str, Any]:
    """A bench run's trainer config: ``base`` updated by ``extra``, with the seed, the step budget and the bench's
    word-level tokenizer and vocabulary size filled in."""
    cfg = merge(base, extra)
    cfg.setdefault("run", {}).update(seed=seed, total_steps=steps)
    model = cfg.setdefault("model", {})
    model["tokenizer"] = str(tokenizer)
    model.setdefault("tiny_overrides", {})["vocab_size"] = vocab
    return cfg


def smoothed(xs: list[float], k: int) -> list[float]:
    """Trailing moving average over ``k`` points (fewer at the start); NaNs are skipped."""
    out = []
    for i in range(len(xs)):
        w = [x for x in xs[max(0, i - k + 1) : i + 1] if math.isfinite(x)]
        out.append(sum(w) / len(w) if w else float("nan"))
    return out


def finite_mean(xs: list[float]) -> float:
    """Mean of the finite values (NaN when there are none)."""
    vals = [x for x in xs if math.isfinite(x)]
    return sum(vals) / len(vals) if vals else float("nan")


def train_run(cfg: dict[str, Any], run_dir: Path) -> tuple[list[dict[str, Any]], float]:
    """Train one config with the real trainer (``trainer.runs.run.train``) in this process; returns its metrics rows
    and the wall-clock seconds of the whole call. A previous run in ``run_dir`` is replaced (the benchmark owns
    its output folder)."""
    from sao.trainer.runs.metrics import read_metrics
    from sao.trainer.runs.run import train

    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cfg = merge(cfg, {"run": {"dir": str(run_dir)}})
    cfg_path = run_dir.with_name(run_dir.name + ".yaml")
    write_yaml_atomic(cfg_path, cfg)
    t0 = time.perf_counter()
    train(str(cfg_path), [])
    return read_metrics(run_dir), time.perf_counter() - t0


def mean_std(xs: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value); NaN for none."""
    vals = [x for x in xs if x is not None and math.isfinite(x)]
    if not vals:
        return float("nan"), float("nan")
    m = sum(vals) / len(vals)
    if len(vals) == 1:
        return m, 0.0
    return m, math.sqrt(sum((x - m) ** 2 for x in vals) / (len(vals) - 1))


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, data, indent=2)


def print_table(headers: list[str], rows: list[list[str]], echo: Callable[[str], None] = print) -> None:
    """A plain aligned text table (also valid Markdown)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    echo("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    echo("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        echo("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |")


# -- warm start: demonstrations from an oracle, then `sao sft` ---------------------------------------------------


def _token_game_oracle(env: Any, rng: Any, spec: dict[str, Any]) -> Callable[[int], str] | None:
    """The TokenGame demonstrator: the right symbol with probability ``accuracy`` (or ``accuracy_by_rule[rule]``,
    or ``accuracy_by_symbol[shown symbol]``, which wins), else another one. Tasks whose rule is not in ``rules``
    (default: all) are not demonstrated (None)."""
    rules = spec.get("rules")
    if rules and env._task_rule not in rules:
        return None
    acc = float(spec.get("accuracy_by_rule", {}).get(env._task_rule, spec.get("accuracy", 1.0)))
    by_symbol = {str(k): float(v) for k, v in spec.get("accuracy_by_symbol", {}).items()}

    def answer(turn: int) -> str:
        right = env.target(env._seq[turn])
        if rng.random() < by_symbol.get(str(env._seq[turn]), acc):
            return str(right)
        return str(rng.choice([s for s in env.symbols if s != right]))

    return answer


def _online_writing_oracle(env: Any, rng: Any, spec: dict[str, Any]) -> Callable[[int], str] | None:
    """The OnlineWriting demonstrator: one of ``replies`` (lines that satisfy the style being taught)."""
    replies = [str(r) for r in spec.get("replies", [])]
    if not replies:
        raise ValueError("warm_start.demo.replies: give the lines to demonstrate, e.g. ['what nice ?']")
    return lambda turn: str(rng.choice(replies))


ORACLES: dict[str, Callable[[Any, Any, dict[str, Any]], Callable[[int], str] | None]] = {
    "sao/TokenGame-v0": _token_game_oracle,
    "sao/OnlineWriting-v0": _online_writing_oracle,
}


def write_demonstrations(
    path: Path, env_id: str, kwargs: dict[str, Any], episodes: int, spec: dict[str, Any], seed: int
) -> int:
    """Play ``episodes`` seeded episodes with the env's oracle (``ORACLES``) and write them as chat conversations
    (OpenAI messages, one JSON line each) for `sao sft`; returns how many were written (tasks the oracle skips
    are not written). The episodes use seeds disjoint from the RL runs' task seeds (``10**6 + ...``)."""
    import random

    import gymnasium

    import sao.envs  # noqa: F401 - registers the sao/ envs

    if env_id not in ORACLES:
        raise ValueError(f"no demonstration oracle for {env_id}; warm starts exist for {sorted(ORACLES)}")
    rng = random.Random(seed)
    lines: list[str] = []
    for k in range(episodes):
        env: Any = gymnasium.make(env_id, **kwargs).unwrapped
        try:
            obs, info = env.reset(seed=10**6 + seed * 10**4 + k)
            answer = ORACLES[env_id](env, rng, spec)
            if answer is None:
                continue
            messages = [{"role": "system", "content": str(info.get("system_prompt") or "")}]
            messages.append({"role": "user", "content": obs})
            done, turn = False, 0
            while not done:
                act = answer(turn)
                messages.append({"role": "assistant", "content": act})
                obs, _, term, trunc, _ = env.step(act)
                done = term or trunc
                turn += 1
                if not done:
                    messages.append({"role": str(info.get("role") or "user"), "content": obs})
            lines.append(json.dumps({"messages": messages}))
        finally:
            env.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_durably(path, "\n".join(lines) + "\n")
    return len(lines)


def warm_start(cfg: dict[str, Any], spec: dict[str, Any], out_dir: Path) -> Path:
    """Make the tiny model of ``cfg`` competent before RL: demonstrations from the env's oracle, then `sao sft`
    (``sao.trainer.sft.run.run_sft``, the action-token loss on the agent's own rendering) from ``cfg``'s model and seed.
    ``spec``: ``episodes``, ``steps``, ``lr``, ``batch_size`` and ``demo`` (the oracle's settings). Returns the
    fine-tuned model dir (``out_dir/final/actor``, tokenizer included) for ``model.path``. Reuses a finished one."""
    from sao.trainer.config import config_from_dict
    from sao.trainer.sft.run import run_sft

    final = out_dir / "final" / "actor"
    if (final / "config.json").exists():
        return final
    if out_dir.exists():
        shutil.rmtree(out_dir)
    env = cfg.get("env", {})
    seed = int(cfg.get("run", {}).get("seed", 0))
    demos = out_dir.with_name(out_dir.name + "_demos.jsonl")
    n = write_demonstrations(
        demos, str(env["id"]), dict(env.get("kwargs", {})), int(spec.get("episodes", 256)), spec.get("demo", {}), seed
    )
    if n == 0:
        raise ValueError(f"warm_start: the oracle demonstrated none of {spec.get('episodes')} episodes; check demo")
    sft_cfg = merge(
        {k: v for k, v in cfg.items() if k in ("model", "deepspeed", "env")},
        {
            "run": {"dir": str(out_dir), "seed": seed, "plot": False, "progress": False, "tensorboard": False,
                    "save_every": 10**6},
            "sft": {"data": [str(demos)], "steps": int(spec.get("steps", 40)), "lr": float(spec.get("lr", 3e-3)),
                    "batch_size": int(spec.get("batch_size", 16))},
        },
    )  # fmt: skip
    run_sft(config_from_dict(sft_cfg), out_dir)
    if not (final / "config.json").exists():
        raise RuntimeError(f"warm_start: `sao sft` finished without writing {final}")
    return final


# -- bench-only algorithms for the ablations ---------------------------------------------------------------------


def _no_correction_loss(x: Any) -> tuple[Any, dict[str, Any]]:
    """``L = -mean_t[A_t * logp_t]``: the policy gradient as if every token were on-policy (no importance weight,
    no mask), the "no correction" arm of the staleness ablation. Logs the DIS ratio metrics it ignores."""
    import torch

    mask = x.action_mask.bool()
    n = mask.sum().clamp(min=1).float()
    denom = torch.tensor(float(x.normalizer)) if x.normalizer is not None else n
    adv = torch.where(mask, x.advantages.to(x.logp.dtype), torch.zeros_like(x.logp))
    loss = -(adv * torch.where(mask, x.logp, torch.zeros_like(x.logp))).sum() / denom
    ratio = torch.exp(torch.where(mask, x.logp.detach() - x.rollout_logp.to(x.logp.dtype), torch.zeros_like(x.logp)))
    metrics = {
        "ratio_mean": (torch.where(mask, ratio, torch.zeros_like(ratio)).sum() / n).detach(),
        "num_tokens": mask.sum().float(),
    }
    return loss, metrics


def register_bench_algorithms() -> None:
    """Ablation arms the product does not ship, registered through the public algorithm registry (idempotent):

    * ``sao_nocorr``: SAO's critic and skip-observation GAE, but the plain policy gradient on stale rollouts
      (no DIS): what DIS is measured against under heavy-tailed latency;
    * ``grpo_async``: GRPO's groups and PPO clip against an old-policy recompute, run asynchronously with
      ``trainer.max_staleness`` (the clip is around the learner's current weights, nothing corrects for the
      engine's older policy): "GRPO without DIS under the same lag".
    """
    from sao.trainer.algos.registry import (
        AlgorithmSpec,
        algorithm_names,
        policy_loss_names,
        register_algorithm,
        register_policy_loss,
    )

    if "pg_no_correction" not in policy_loss_names():
        register_policy_loss("pg_no_correction")(_no_correction_loss)
    known = algorithm_names()
    if "sao_nocorr" not in known:
        register_algorithm(
            AlgorithmSpec(
                "sao_nocorr",
                advantage="skip_obs_gae",
                policy_loss="pg_no_correction",
                critic=True,
                summary="bench ablation: SAO without DIS (plain policy gradient on stale rollouts)",
            )
        )
    if "grpo_async" not in known:
        register_algorithm(
            AlgorithmSpec(
                "grpo_async",
                advantage="grpo",
                policy_loss="ppo_clip",
                critic=False,
                old_policy_recompute=True,
                grouped=True,
                summary="bench ablation: GRPO groups + PPO clip, asynchronous with trainer.max_staleness, no DIS",
            )
        )


def tiny_model_threads(n: int = 1) -> None:
    """Run torch's CPU ops on ``n`` threads. The bench models are tiny (a few thousand FLOPs per token): extra
    intra-op threads buy nothing and, on a loaded machine, their spin-waits cost more than the work (an SFT step
    of the tiny model took 4-20 s with the default threads on the shared 2-core box)."""
    import torch

    torch.set_num_threads(max(1, int(n)))


def warm_start_check(
    model_dir: Path,
    env_id: str,
    kwargs: dict[str, Any],
    words: list[str],
    episodes: int = 64,
    seed: int = 0,
    demo: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """How a warm-started model answers held-out episodes: the oracle's right answers (``accuracy`` 1) on task seeds
    disjoint from the demonstrations and the RL runs are rendered as the agent renders them, and at every answer
    token the model's distribution restricted to ``words`` (the rollout's ``action_vocab``) is read off. Returns
    ``p_right`` (mean probability of the right word), ``acc`` (argmax right), ``entropy`` (nats), per rule for
    TokenGame (``by_rule``), and ``n`` answers (for OnlineWriting: the words of ``demo``'s replies). A useful warm
    start has ``p_right`` near the demonstrator's accuracy and an entropy well above 0 (room for RL to explore)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sao.trainer.sft.data import load_examples

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir))
    model.eval()
    ids = [int(tok.convert_tokens_to_ids(str(w))) for w in words]  # type: ignore[arg-type]
    tmp = Path(str(model_dir)).parent / "warm_check_demos.jsonl"
    # the oracle's settings (OnlineWriting: its replies) with TokenGame's answers always right; seeds no run uses
    write_demonstrations(tmp, env_id, kwargs, episodes, {**(demo or {}), "accuracy": 1.0}, seed + 1000)
    rules = []  # TokenGame `rule: mixed` prompts name their rule ("Rule next: ...")
    for line in tmp.read_text().splitlines():
        first = str(json.loads(line)["messages"][1]["content"])
        rules.append("next" if "Rule next" in first else "copy" if "Rule copy" in first else "all")
    examples, _ = load_examples([str(tmp)], tok)
    stats: dict[str, list[tuple[float, float, float]]] = {}
    with torch.no_grad():
        for ex, rule in zip(examples, rules, strict=True):
            x = torch.tensor([ex.input_ids])
            logits = model(input_ids=x).logits[0, :-1, ids].float()
            logp = torch.log_softmax(logits, -1)
            for t in range(len(ex.input_ids) - 1):
                target = ex.input_ids[t + 1]
                if not ex.loss_mask[t + 1] or target not in ids:
                    continue
                j = ids.index(target)
                p = logp[t].exp()
                ent = float(-(p * logp[t]).sum())
                stats.setdefault(rule, []).append((float(p[j]), float(int(p.argmax()) == j), ent))
    tmp.unlink(missing_ok=True)

    def agg(rows: list[tuple[float, float, float]]) -> dict[str, float]:
        n = max(1, len(rows))
        return {
            "p_right": sum(r[0] for r in rows) / n,
            "acc": sum(r[1] for r in rows) / n,
            "entropy": sum(r[2] for r in rows) / n,
            "n": float(len(rows)),
        }

    out: dict[str, Any] = agg([r for rows in stats.values() for r in rows])
    out["by_rule"] = {k: agg(v) for k, v in stats.items()}
    return out


def map_in_workers(
    fn: Callable[..., Any],
    calls: list[tuple[Any, ...]],
    jobs: int,
    each: Callable[[int, Any], None],
    progress: Callable[[set[int]], None] | None = None,
    every_s: float = 60.0,
    fresh_process: bool = False,
) -> list[Any]:
    """``fn(*call)`` for every call: in this process when ``jobs`` <= 1, else in ``jobs`` spawned worker processes
    (``SAO_BENCH_WORKER=1`` in their environment; ``fresh_process``: a new process per call, so a finished run's
    models and process group do not stay behind). ``each(i, result)`` as call ``i`` finishes; ``progress(running)``
    every ``every_s`` seconds meanwhile. Results in call order; a failed call raises here."""
    results: list[Any] = [None] * len(calls)
    if jobs <= 1:
        for i, c in enumerate(calls):
            results[i] = fn(*c)
            each(i, results[i])
        return results
    import multiprocessing
    import os
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    os.environ["SAO_BENCH_WORKER"] = "1"  # the spawned children copy the environment
    try:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(jobs, mp_context=ctx, max_tasks_per_child=1 if fresh_process else None) as pool:
            futs = {pool.submit(fn, *c): i for i, c in enumerate(calls)}
            pending = set(futs)
            while pending:
                finished, pending = wait(pending, timeout=every_s, return_when=FIRST_COMPLETED)
                for f in finished:
                    results[futs[f]] = f.result()
                    each(futs[f], results[futs[f]])
                if pending and progress is not None:
                    progress({futs[f] for f in pending if f.running()})
    finally:
        os.environ.pop("SAO_BENCH_WORKER", None)
    return results
