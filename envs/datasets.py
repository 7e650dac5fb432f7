"""Math task sources for PythonToolEnv: benchmark files, any local file or HF dataset, and generated arithmetic.

Every loader returns task records ``{"id": str, "problem": str, "answer": str}``.

``load_math_tasks(source)`` reads, with the ``datasets`` library:
- a benchmark name from the shared data folder (``saocore.paths.shared_data_dir()``): ``aime24``, ``aime25``
  (JSONL ``{prompt, answer}``) and ``imo_answerbench`` (CSV, columns ``Problem`` / ``Short Answer``);
- a local ``.jsonl`` / ``.json`` / ``.csv`` / ``.parquet`` file;
- otherwise a Hugging Face dataset name (``load_dataset(name, split=split)``; needs the hub or its cache).
Problem and answer columns are found among common names (``problem``, ``prompt``, ``question``, ``Problem`` /
``answer``, ``Short Answer``, ``final_answer``...) or given with ``problem_key`` / ``answer_key``.

``arithmetic_tasks(n, seed)`` generates easy arithmetic problems meant to be solved with the python tool (the
quickstart's training data): exact integer answers a small model can check by running one line of code.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

BENCHMARKS: dict[str, str] = {
    "aime24": "aime24.jsonl",
    "aime25": "aime25.jsonl",
    "imo_answerbench": "imo_answerbench_v2.csv",
}
PROBLEM_KEYS = ("problem", "prompt", "question", "Problem", "Question", "input")
ANSWER_KEYS = ("answer", "Short Answer", "final_answer", "Answer", "solution_answer", "target")
ID_KEYS = ("id", "Problem ID", "problem_id", "ID", "unique_id")
_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


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


def _open(source: str, split: str) -> tuple[Any, str]:
    from datasets import load_dataset

    if source in BENCHMARKS:
        from saocore.paths import shared_data_dir

        root = shared_data_dir()
        if root is None or not (root / BENCHMARKS[source]).exists():
            raise FileNotFoundError(
                f"benchmark {source!r} needs {BENCHMARKS[source]} in the shared data folder; set SAO_DATA to the "
                "folder holding it (see saocore.paths.shared_data_dir)"
            )
        path = root / BENCHMARKS[source]
        return load_dataset(_FORMATS[path.suffix], data_files=str(path), split="train"), source
    path = Path(source).expanduser()
    if path.suffix in _FORMATS:
        if not path.exists():
            raise FileNotFoundError(f"math task file {path} does not exist")
        return load_dataset(_FORMATS[path.suffix], data_files=str(path), split="train"), path.stem
    if path.exists():
        raise ValueError(f"{path}: unsupported file type {path.suffix!r}; use one of {sorted(_FORMATS)}")
    return load_dataset(source, split=split), source.replace("/", "_")


def load_math_tasks(
    source: str,
    *,
    problem_key: str | None = None,
    answer_key: str | None = None,
    split: str = "train",
    limit: int | None = None,
) -> list[dict[str, str]]:
    """Task records from a benchmark name, a local file or an HF dataset (see the module doc)."""
    ds, prefix = _open(source, split)
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
