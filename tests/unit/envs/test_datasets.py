"""Dataset specs: shipped benchmarks by name, local JSONL/parquet task files, errors; model aliases wherever named."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sao.envs.datasets import BENCHMARKS, load_math_tasks, load_tasks


@pytest.mark.parametrize(("name", "rows"), [("aime24", 30), ("aime25", 30), ("imo_answerbench", 400)])
def test_shipped_benchmark_loads_by_name(name: str, rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SAO_DATA", raising=False)  # nothing outside the package is consulted
    tasks = load_math_tasks(name)
    assert len(tasks) == rows and len({t["id"] for t in tasks}) == rows
    assert all(t["problem"] and t["answer"] for t in tasks)
    if name.startswith("aime"):
        assert all(0 <= int(t["answer"]) <= 999 for t in tasks)
    assert load_tasks(name, limit=2) == tasks[:2]


def test_package_data_declared_for_every_benchmark() -> None:
    import tomllib

    root = Path(__file__).resolve().parents[3]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["sao.envs"]
    for file in BENCHMARKS.values():
        assert any(Path("data", file).match(p) for p in patterns), f"{file} would not be installed by pip"


def test_training_tasks_from_jsonl_and_parquet(tmp_path: Path) -> None:
    rows = [
        {"instance_id": "a-1", "problem_statement": "fix it", "FAIL_TO_PASS": '["t"]'},
        {"id": "x", "n": 2},
    ]
    f = tmp_path / "tasks.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    # A key some rows lack stays absent (no None filled in by the Arrow schema).
    assert load_tasks(str(f)) == rows
    assert load_tasks(str(f), limit=1) == rows[:1]
    import datasets

    pq = tmp_path / "tasks.parquet"
    datasets.Dataset.from_list([{"problem": "1+1?", "answer": "2"}]).to_parquet(str(pq))
    assert load_tasks(str(pq)) == [{"problem": "1+1?", "answer": "2"}]
    arith = load_tasks("arithmetic", num_generated=5, seed=1)
    assert len(arith) == 5 and arith == load_tasks("arithmetic", num_generated=5, seed=1)


def test_bad_dataset_specs_say_what_is_accepted(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"does not exist.*shipped benchmark"):
        load_tasks(str(tmp_path / "gone.jsonl"))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": "a"\n')
    with pytest.raises(ValueError, match=r"broken.jsonl cannot be read as json \(ArrowInvalid: JSON parse error"):
        load_tasks(str(broken))
    (tmp_path / "t.txt").write_text("x")
    with pytest.raises(ValueError, match="unsupported file type"):
        load_tasks(str(tmp_path / "t.txt"))
    with pytest.raises(ValueError, match="empty dataset name"):
        load_tasks(" ")
    # A misspelt name is neither shipped nor a file: tried on the hub, failing in seconds where it is unreachable.
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"'aime26' is not a shipped benchmark \(aime24, aime25, imo_answerbench\)"):
        load_math_tasks("aime26")
    assert time.monotonic() - t0 < 20


def test_model_alias_resolves_in_training_and_eval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sao.core.paths import resolve_model_path, smollm2_dir
    from sao.eval.common import parse_model_spec

    monkeypatch.setenv("SAO_CACHE", str(tmp_path))
    d = smollm2_dir()
    assert resolve_model_path("smollm2") == str(d) == resolve_model_path("SmolLM2")
    assert resolve_model_path("tiny:llama") == "tiny:llama"
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    assert parse_model_spec("local:smollm2").path == str(d)
    assert parse_model_spec("hf:smollm2").path == str(d)
    import transformers

    from sao.agent.engines.registry import load_tokenizer

    seen: list[str] = []
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda path, **kw: seen.append(path))
    load_tokenizer("smollm2")  # --tokenizer smollm2 reads the alias's directory
    assert seen == [str(d)]
