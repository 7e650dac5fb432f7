"""Shared parts of the RL benchmarks: a word-level tokenizer for tiny models, config files, in-process runs, stats.

Why a word-level tokenizer: a tiny random-init model with SmolLM2's 49k-token vocabulary spends nearly all of a
training step on the output layer (logits of every position over 49k tokens), ~15 s per step on 2 cores. The
benchmarks measure the pipeline and the algorithms, not a vocabulary projection, so they give the tiny model a
vocabulary made of the words its env can print (a ChatML template, ~50 tokens): a step then takes well under a
second while every other part (agent, engine, coordinator, DeepSpeed learner, weight sync) is the real one.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ("<pad>", "<unk>", "<|im_start|>", "<|im_end|>")


def env_texts(env_id: str, kwargs: dict[str, Any], episodes: int = 40, action: str = "A") -> list[str]:
    """Every text an env shows in ``episodes`` seeded episodes (prompts, observations, system prompt)."""
    import gymnasium

    import envs  # noqa: F401 - registers the sao/ envs

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


def deep_update(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``base`` with ``extra`` merged in recursively (mappings merge, other values replace)."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_update(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"benchmark config {path} not found; pass --config with a file from configs/bench/")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a mapping")
    return data


def train_run(cfg: dict[str, Any], run_dir: Path) -> tuple[list[dict[str, Any]], float]:
    """Train one config with the real trainer (``trainer.run.train``) in this process; returns its metrics rows
    and the wall-clock seconds of the whole call. A previous run in ``run_dir`` is replaced (the benchmark owns
    its output folder)."""
    from trainer.metrics import read_metrics
    from trainer.run import train

    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cfg = deep_update(cfg, {"run": {"dir": str(run_dir)}})
    cfg_path = run_dir.with_name(run_dir.name + ".yaml")
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
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
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def print_table(headers: list[str], rows: list[list[str]], echo: Callable[[str], None] = print) -> None:
    """A plain aligned text table (also valid Markdown)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    echo("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    echo("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        echo("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |")
