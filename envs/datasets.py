"""Task sources, all read with the ``datasets`` library: shipped benchmarks, local files, hub ids, generated arithmetic.

A dataset SPEC (wherever one is named: ``env.tasks``, ``--dataset``, an env's ``dataset=`` kwarg) is one of:
- a benchmark shipped in the package (``envs/data/``, sources and licences in its README): ``aime24``, ``aime25``,
  ``imo_answerbench``;
- a local ``.jsonl`` / ``.json`` / ``.csv`` / ``.parquet`` file;
- otherwise a Hugging Face dataset id (``load_dataset(id, split=split)``; needs the hub or its local cache).

``load_tasks(spec)`` gives training task records (``env.tasks``): the benchmark names give math records, ``arithmetic``
generated ones, files and hub ids their rows as they are (JSON nulls dropped, so a key some rows lack stays absent).
``load_math_tasks(spec)`` gives math records ``{"id": str, "problem": str, "answer": str}``; problem and answer
columns are found among common names (``problem``, ``prompt``, ``question``, ``Problem`` / ``answer``,
``Short Answer``, ``final_answer``...) or given with ``problem_key`` / ``answer_key``.

``swe-offline:NAME`` is the training split of a named set of offline SWE tasks
(``sao.envs.swe.tasks.offline.TASK_SETS``,
built and cached on first use) and ``swe-offline:NAME:heldout`` its held-out split; ``held_out_spec(spec)`` names
the held-out split of a source that has one.

``arithmetic_tasks(n, seed)`` generates easy arithmetic problems meant to be solved with the python tool (the
quickstart's training data): exact integer answers a small model can check by running one line of code.
``arithmetic_chain_tasks(n, seed, levels)`` (spec ``arithmetic_chain``, or ``arithmetic_chain:1,1,2,3,4`` for a level
mix) generates problems of visible, graded difficulty: level L is a chain of L steps, each run with one tool call on
the number the previous call printed, so a level-L episode needs L calls and L + 1 turns.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"
BENCHMARKS: dict[str, str] = {
    "aime24": "aime24.jsonl",
    "aime25": "aime25.jsonl",
    "imo_answerbench": "imo_answerbench_v2.csv",
}
ARITHMETIC = "arithmetic"
ARITHMETIC_CHAIN = "arithmetic_chain"
CHAIN_LEVELS = (1, 2, 3, 4)
CHAIN_ANS = "ANS"
"""The name a chain step gives the number the previous tool call printed."""
SWE_OFFLINE = "swe-offline:"
HUB_PROBE_TIMEOUT_S = 3.0
PROBLEM_KEYS = ("problem", "prompt", "question", "Problem", "Question", "input")
ANSWER_KEYS = ("answer", "Short Answer", "final_answer", "Answer", "solution_answer", "target")
ID_KEYS = ("id", "Problem ID", "problem_id", "ID", "unique_id")
_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
SPEC_FORMS = (
    f"a shipped benchmark ({', '.join(BENCHMARKS)}), a local {'/'.join(sorted(_FORMATS))} file or a Hugging Face "
    "dataset id"
)


def hub_available(timeout_s: float | None = None) -> bool:
    """True when the Hugging Face Hub answers within ``timeout_s`` (or offline mode is on: the HF cache is then
    read), so a dataset id that cannot load fails in seconds, not after minutes of retries."""
    if any(os.environ.get(v, "").lower() in ("1", "true", "yes") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return True
    import httpx
    from huggingface_hub import constants

    try:
        httpx.head(constants.ENDPOINT, timeout=HUB_PROBE_TIMEOUT_S if timeout_s is None else timeout_s)
        return True
    except httpx.HTTPError:
        return False


def benchmark_path(name: str) -> Path:
    """The packaged file of benchmark ``name`` (one of ``BENCHMARKS``)."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; shipped benchmarks are {sorted(BENCHMARKS)}")
    path = DATA_DIR / BENCHMARKS[name]
    if not path.is_file():
        raise FileNotFoundError(f"benchmark {name!r}: {path} is missing from the installed package; reinstall sao")
    return path


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """No "Generating train split" bars for our small files: the caller shows its own progress."""
    import datasets
    from datasets.utils import logging as ds_logging

    was_enabled = datasets.is_progress_bar_enabled()
    level = ds_logging.get_verbosity()
    datasets.disable_progress_bars()
    ds_logging.set_verbosity(ds_logging.CRITICAL)  # a failed load is re-raised with its message
    try:
        yield
    finally:
        ds_logging.set_verbosity(level)
        if was_enabled:
            datasets.enable_progress_bars()


def load_records(source: str, *, split: str = "train") -> tuple[Any, str]:
    """``(datasets.Dataset, short name)`` for a dataset SPEC (see the module doc); errors say which forms exist."""
    from datasets import load_dataset

    if not source or not source.strip():
        raise ValueError(f"empty dataset name; give {SPEC_FORMS}")
    with _quiet_datasets():
        if source in BENCHMARKS:
            return _load_file(benchmark_path(source)), source
        path = Path(source).expanduser()
        if path.suffix in _FORMATS:
            if not path.is_file():
                raise FileNotFoundError(f"dataset file {path} does not exist; give {SPEC_FORMS}")
            return _load_file(path), path.stem
        if path.exists():
            raise ValueError(f"{path}: unsupported file type {path.suffix!r}; use one of {sorted(_FORMATS)}")
        if not hub_available():
            raise ValueError(
                f"dataset {source!r} is not a shipped benchmark ({', '.join(BENCHMARKS)}) nor a local file, and the "
                f"Hugging Face Hub does not answer from here (within {HUB_PROBE_TIMEOUT_S:g} s); pass a local "
                f"{'/'.join(sorted(_FORMATS))} file, or set HF_HUB_OFFLINE=1 to read a copy in the HF cache"
            )
        try:
            ds = load_dataset(source, split=split)
        except Exception as e:
            raise ValueError(
                f"dataset {source!r} is not a shipped benchmark ({', '.join(BENCHMARKS)}) nor a local file, and "
                f"loading it as a Hugging Face dataset failed ({type(e).__name__}: {e}); pass a local "
                f"{'/'.join(sorted(_FORMATS))} file, or set HF_HUB_OFFLINE=1 to read a copy in the HF cache"
            ) from e
        return ds, source.replace("/", "_")


def _load_file(path: Path) -> Any:
    from datasets import load_dataset

    fmt = _FORMATS[path.suffix]
    try:
        return load_dataset(fmt, data_files=str(path), split="train")
    except Exception as e:
        # datasets wraps the parser's message (the useful part: what and which row) in a generic error.
        cause = e.__cause__ or e.__context__ or e
        raise ValueError(
            f"dataset file {path} cannot be read as {fmt} ({type(cause).__name__}: {cause}); fix the file "
            f"(one JSON object per line for .jsonl)"
        ) from e


def _pick(columns: list[str], wanted: str | None, candidates: tuple[str, ...], what: str, source: str) -> str:
    if wanted is not None:
        if wanted not in columns:
            raise ValueError(f"{source}: no column {wanted!r} (the {what} column); columns are {columns}")
        return wanted
    for c in candidates:
        if c in columns:
            return c
    raise ValueError(
        f"{source}: cannot find the {what} column among {columns}; pass {what}_key= naming it "
        f"(looked for {list(candidates)})"
    )


def load_math_tasks(
    source: str,
    *,
    problem_key: str | None = None,
    answer_key: str | None = None,
    split: str = "train",
    limit: int | None = None,
) -> list[dict[str, str]]:
    """Math task records from a benchmark name, a local file or an HF dataset (see the module doc)."""
    ds, prefix = load_records(source, split=split)
    cols = list(ds.column_names)
    pk = _pick(cols, problem_key, PROBLEM_KEYS, "problem", source)
    ak = _pick(cols, answer_key, ANSWER_KEYS, "answer", source)
    ik = next((c for c in ID_KEYS if c in cols), None)
    out: list[dict[str, str]] = []
    for i, row in enumerate(ds):
        if limit is not None and i >= limit:
            break
        answer = str(row[ak]).strip()
        if answer.endswith(".") and not answer.endswith(".."):
            answer = answer[:-1]  # IMO-AnswerBench short answers end with a sentence period
        out.append(
            {
                "id": str(row[ik]) if ik else f"{prefix}-{i}",
                "problem": str(row[pk]).strip(),
                "answer": answer,
            }
        )
    if not out:
        raise ValueError(f"{source}: no rows in split {split!r}")
    return out


def load_tasks(
    spec: str, *, num_generated: int = 1000, seed: int = 0, split: str = "train", limit: int | None = None
) -> list[dict[str, Any]]:
    """Training task records for ``env.tasks`` (see the module doc); each reaches the env as
    ``reset(options={"task": record})``. ``num_generated`` and ``seed`` size ``arithmetic``; ``limit`` caps the rows.
    """
    if spec == ARITHMETIC:
        return arithmetic_tasks(num_generated if limit is None else min(limit, num_generated), seed=seed)
    levels = chain_levels(spec)
    if levels is not None:
        return arithmetic_chain_tasks(num_generated if limit is None else min(limit, num_generated), seed, levels)
    if spec.startswith(SWE_OFFLINE):
        from sao.envs.swe.tasks.offline import task_set

        name, _, part = spec[len(SWE_OFFLINE) :].partition(":")
        return task_set(name, part or "train")[:limit]
    if spec in BENCHMARKS:
        return list(load_math_tasks(spec, limit=limit))
    ds, _ = load_records(spec, split=split)
    out: list[dict[str, Any]] = []
    for i, row in enumerate(ds):
        if limit is not None and i >= limit:
            break
        out.append({k: v for k, v in row.items() if v is not None})
    if not out:
        raise ValueError(f"{spec}: no task records (split {split!r})")
    return out


def generated_eval_spec(spec: str | None) -> str:
    """The generator held-out tasks are drawn from for training source ``spec``: ``arithmetic_chain`` (every level
    in turn, so a held-out set is stratified by level) for any chain mix, else ``arithmetic``."""
    return ARITHMETIC_CHAIN if spec is not None and chain_levels(spec) is not None else ARITHMETIC


def held_out_spec(spec: str | None) -> str | None:
    """The held-out split of task source ``spec`` when it has one (``swe-offline:NAME``), else ``None``."""
    if spec and spec.startswith(SWE_OFFLINE) and spec.count(":") == 1:
        return f"{spec}:heldout"
    return None


def arithmetic_tasks(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` easy arithmetic problems with exact integer answers, reproducible from ``seed``."""
    if n < 1:
        raise ValueError(f"arithmetic_tasks: n must be >= 1, got {n}")
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        kind = rng.randrange(4)
        a, b, c = rng.randint(12, 999), rng.randint(12, 999), rng.randint(2, 99)
        if kind == 0:
            expr, value = f"{a} * {b} + {c}", a * b + c
        elif kind == 1:
            expr, value = f"{a} * {b} - {c} * {c}", a * b - c * c
        elif kind == 2:
            expr, value = f"({a} + {b}) * {c}", (a + b) * c
        else:
            expr, value = f"{a * c} // {c} + {b}", a + b
        problem = f"Compute {expr}. Use the python tool to check, then give the result as \\boxed{{N}}."
        tasks.append({"id": f"arith-{seed}-{i}", "problem": problem, "answer": str(value)})
    return tasks


def chain_levels(spec: str) -> tuple[int, ...] | None:
    """The level mix of an ``arithmetic_chain`` spec (``arithmetic_chain``: levels 1-4; ``arithmetic_chain:1,2,2``:
    those levels, cycled task by task), None for any other spec."""
    name, sep, mix = spec.partition(":")
    if name != ARITHMETIC_CHAIN:
        return None
    if not sep:
        return CHAIN_LEVELS
    try:
        levels = tuple(int(x) for x in mix.split(","))
    except ValueError:
        levels = ()
    if not levels or not all(min(CHAIN_LEVELS) <= lv <= max(CHAIN_LEVELS) for lv in levels):
        raise ValueError(
            f"{spec!r}: a chain level mix is comma-separated levels {min(CHAIN_LEVELS)}-{max(CHAIN_LEVELS)}, "
            f"e.g. '{ARITHMETIC_CHAIN}:1,2,3,4'"
        )
    return levels


def _chain_step(rng: random.Random, value: int) -> tuple[str, int]:
    """One step after the first: ``(text, new value)``; the value stays a positive integer of at most ~7 digits."""
    ops = (
        ["+"] + (["-"] if value > 1100 else []) + (["*"] if value < 200_000 else []) + (["//"] if value > 1000 else [])
    )
    op = rng.choice(ops)
    operand = rng.randint(101, 999) if op in "+-" else rng.randint(2, 9)
    new = {"+": value + operand, "-": value - operand, "*": value * operand, "//": value // operand}[op]
    return f"{CHAIN_ANS} {op} {operand}", new


def arithmetic_chain_tasks(n: int, seed: int = 0, levels: tuple[int, ...] = CHAIN_LEVELS) -> list[dict[str, Any]]:
    """``n`` chain problems (see the module doc), task ``i`` of level ``levels[i % len(levels)]``, reproducible
    from ``seed``. Step 1 is a product of a 3-digit and a 2-digit number; each later step applies ``+``, ``-``
    (3-digit operands), ``*`` or ``//`` (one digit) to ``ANS``. Records carry their ``level``."""
    if n < 1:
        raise ValueError(f"arithmetic_chain_tasks: n must be >= 1, got {n}")
    rng = random.Random(seed)
    tasks: list[dict[str, Any]] = []
    for i in range(n):
        level = levels[i % len(levels)]
        a, b = rng.randint(101, 999), rng.randint(12, 99)
        steps, value = [f"{a} * {b}"], a * b
        for _ in range(level - 1):
            text, value = _chain_step(rng, value)
            steps.append(text)
        plural = "s" if level > 1 else ""
        problem = (
            f"Level {level} of {max(CHAIN_LEVELS)}: {level} step{plural}. Run each step with the python tool, one call "
            f"per step; {CHAIN_ANS} is the number the previous call printed. After the last step, answer with the last "
            "number printed in \\boxed{}.\n" + "\n".join(f"Step {k}: {text}" for k, text in enumerate(steps, 1))
        )  # it ends on the steps: a prompt ending on "\\boxed{N}" had the SFT policy answer "\\boxed{N}" at once
        # answer_format: the number the last call printed; math-verify alone would accept "\\boxed{608 * 69}" at level 1
        record = {"id": f"chain-{seed}-{i}", "problem": problem, "answer": str(value), "level": level}
        tasks.append(record | {"answer_format": "integer"})
    return tasks
