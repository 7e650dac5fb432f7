"""SFT examples: chat conversations or SAO trajectories -> (token ids, action mask), and length-bucketed batches.

Two record kinds, detected per record:

* **chat**: ``{"messages": [...], "tools": [...]?}`` in the OpenAI messages format (assistant ``tool_calls``
  included), rendered with the agent's own renderer (``sao.agent.conversation.render_conversation``): the ids are
  the ones the agent would have produced at rollout time; only assistant tokens are trained.
* **trajectory**: an ``sao.agent.records.Trajectory`` (or a run's ``trajectories.jsonl`` line, ``{"type":
  "trajectory", "trajectory": {...}}``): trained on its own token ids, action segments only. Kept when
  ``status`` is not ``infra_error`` and ``reward >= min_reward`` (rejection-sampling fine-tuning).

Sources: local ``.jsonl`` files are read line by line (errors name the exact line); ``.json`` / ``.parquet``
files and Hugging Face hub ids go through ``datasets.load_dataset`` (errors name the row). Several sources may
be given. A bad record raises ``SFTDataError`` naming the file, the line and the fix.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sao.agent.chat import ChatRenderer
from sao.agent.conversation import ConversationError, render_conversation
from sao.agent.records import Trajectory


class SFTDataError(ValueError):
    """An SFT input record is unusable; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class Example:
    """One training sequence: token ids and, per token, whether the loss applies (action tokens only)."""

    input_ids: tuple[int, ...]
    loss_mask: tuple[bool, ...]
    source: str

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class LoadStats:
    records: int = 0
    kept: int = 0
    below_min_reward: int = 0
    infra_errors: int = 0
    too_long: int = 0


def _records(source: str) -> Iterator[tuple[str, Any]]:
    """``(where, record)`` for every record of ``source`` (``where`` = ``file:line`` or ``source row N``)."""
    from sao.core.jsonl import iter_jsonl

    path = Path(source).expanduser()
    if path.suffix == ".jsonl":
        if not path.is_file():
            raise SFTDataError(
                f"sft data {str(path)!r} does not exist; give a JSONL / parquet file or a hub dataset id"
            )
        for n, rec in iter_jsonl(path, error=SFTDataError, fix="each line must be one JSON object"):
            yield f"{path}:{n}", rec
        return
    from datasets import load_dataset

    if path.suffix in (".json", ".parquet"):
        if not path.is_file():
            raise SFTDataError(f"sft data {str(path)!r} does not exist")
        ds = load_dataset("json" if path.suffix == ".json" else "parquet", data_files=str(path), split="train")
    elif path.exists():
        raise SFTDataError(f"sft data {str(path)!r}: unsupported file type; use .jsonl, .json or .parquet")
    else:
        try:
            ds = load_dataset(source, split="train")
        except Exception as e:
            raise SFTDataError(
                f"sft data {source!r}: not a local file and loading it as a Hugging Face dataset failed ({e})"
            ) from e
    for i, rec in enumerate(ds):
        yield f"{source} row {i + 1}", rec


def _trajectory_example(
    where: str, rec: dict[str, Any], tokenizer: Any, min_reward: float | None, stats: LoadStats
) -> Example | None:
    try:
        tr = Trajectory.from_dict(rec)
    except (KeyError, ValueError, TypeError) as e:
        raise SFTDataError(
            f"{where}: not a valid trajectory record ({type(e).__name__}: {e}); trajectories come from "
            "`sao collect` or a run's trajectories.jsonl"
        ) from e
    if tr.status == "infra_error":
        stats.infra_errors += 1
        return None
    if min_reward is not None and tr.reward < min_reward:
        stats.below_min_reward += 1
        return None
    if not tr.action_segments:
        raise SFTDataError(f"{where}: the trajectory has no action segment: nothing to train on; drop the line")
    _check_tokenizer(where, tr, tokenizer)
    ids: list[int] = []
    mask: list[bool] = []
    for s in tr.segments:
        ids += s.token_ids
        mask += [s.kind == "action"] * len(s.token_ids)
    return Example(tuple(ids), tuple(mask), where)


def _check_tokenizer(where: str, tr: Trajectory, tokenizer: Any) -> None:
    """A trajectory written with another tokenizer has ids out of range, or a prompt that does not survive a
    decode / encode round trip (prompts are encoded text, so they always do with the right tokenizer)."""
    vocab = len(tokenizer)
    top = max(tr.token_ids)
    fix = (
        "it was written with a different tokenizer; train the model that produced it (model.path / "
        "model.tokenizer) or collect new trajectories with this model"
    )
    if top >= vocab or min(tr.token_ids) < 0:
        raise SFTDataError(f"{where}: token id {top} is outside this tokenizer's vocabulary ({vocab}): {fix}")
    prompt = tr.segments[0]
    if prompt.kind == "prompt":
        text = tokenizer.decode(list(prompt.token_ids), skip_special_tokens=False)
        if list(tokenizer.encode(text, add_special_tokens=False)) != list(prompt.token_ids):
            raise SFTDataError(f"{where}: the prompt tokens do not round-trip through this tokenizer: {fix}")


def _chat_example(where: str, rec: dict[str, Any], chat: ChatRenderer) -> Example:
    messages = rec["messages"]
    if isinstance(messages, str):
        messages = json.loads(messages)  # parquet files often store the list as a JSON string
    tools = rec.get("tools")
    if isinstance(tools, str):
        tools = json.loads(tools) if tools.strip() else None
    try:
        r = render_conversation(chat, list(messages), tools or None)
    except ConversationError as e:
        raise SFTDataError(f"{where}: {e}") from e
    return Example(r.input_ids, r.action_mask, where)


def load_examples(
    sources: list[str], tokenizer: Any, *, min_reward: float | None = None, max_len: int | None = None
) -> tuple[list[Example], LoadStats]:
    """Every usable example of ``sources`` (record kinds and filters in the module doc), in content order."""
    chat = ChatRenderer(tokenizer)
    stats = LoadStats()
    out: list[Example] = []
    for source in sources:
        for where, rec in _records(source):
            stats.records += 1
            if not isinstance(rec, dict):
                raise SFTDataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
            if rec.get("type") in ("event", "resume"):
                continue  # a run's trajectories.jsonl also logs events
            body = rec.get("trajectory", rec) if rec.get("type") == "trajectory" else rec
            if "messages" in body:
                ex: Example | None = _chat_example(where, body, chat)
            elif "segments" in body:
                ex = _trajectory_example(where, body, tokenizer, min_reward, stats)
            else:
                raise SFTDataError(
                    f"{where}: missing field 'messages' (a chat conversation) or 'segments' (an SAO trajectory); "
                    f"the record has keys {sorted(body)}"
                )
            if ex is None:
                continue
            if not any(ex.loss_mask):
                raise SFTDataError(f"{where}: no assistant tokens to train on; add an assistant message")
            if max_len is not None and len(ex) > max_len:
                stats.too_long += 1
                continue
            out.append(ex)
    # A file's order is not part of the data (a concurrent collect writes its episodes as they finish, in an order
    # that differs from run to run): in content order, the same examples and run.seed make the same SFT batches.
    out.sort(key=lambda e: (e.input_ids, e.loss_mask))
    stats.kept = len(out)
    if not out:
        raise SFTDataError(
            f"no SFT examples left in {sources} ({stats.records} records: {stats.below_min_reward} below "
            f"min_reward, {stats.infra_errors} infra errors, {stats.too_long} longer than max_len); lower "
            "sft.min_reward, raise sft.max_len or add data"
        )
    return out, stats


def bucketed_batches(lengths: list[int], batch_size: int, seed: int, window: int = 16) -> list[list[int]]:
    """One epoch of batches of exactly ``batch_size`` indices, with similar lengths in a batch.

    Shuffle, sort each window of ``window * batch_size`` indices by length and cut it into batches, then shuffle
    the batches: a CPU step then pads little, while the order stays random from epoch to epoch. A last partial
    batch is topped up with random examples (every step has the same number of micro batches).
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    rng = random.Random(seed)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    while len(order) % batch_size:
        order.append(rng.randrange(len(lengths)))
    span = window * batch_size
    batches: list[list[int]] = []
    for start in range(0, len(order), span):
        chunk = sorted(order[start : start + span], key=lambda i: lengths[i])
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def padding_fraction(batches: list[list[int]], lengths: list[int], micro: int) -> float:
    """Fraction of padded positions when each micro batch is padded to its longest row."""
    real = padded = 0
    for b in batches:
        for i in range(0, len(b), micro):
            rows = [lengths[j] for j in b[i : i + micro]]
            real += sum(rows)
            padded += max(rows) * len(rows)
    return 1.0 - real / padded if padded else 0.0
