"""Eval CLI pure parts: model SPEC parsing, scripts, pass@k against brute force, math summary, HF offline check."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from sao.eval import swebench_eval as eval_swebench
from sao.eval.common import EvalError, parse_model_spec, pass_at_k
from sao.eval.math_eval import summarize


def test_specs_of_every_kind(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    script = tmp_path / "s.jsonl"
    script.write_text('{"id": "a", "actions": ["x"]}\n')
    v = parse_model_spec("vllm:http://h1:8000/, http://h2:8001")
    assert (v.kind, v.urls) == ("vllm", ("http://h1:8000", "http://h2:8001"))
    assert parse_model_spec(f"local:{tmp_path}").path == str(tmp_path)
    assert parse_model_spec(f"hf:{tmp_path}").kind == "hf"
    o = parse_model_spec("openai:org/model@v2@https://api.example.com/v1")
    assert (o.model, o.base_url, o.name) == ("org/model@v2", "https://api.example.com/v1", "org/model@v2")
    assert parse_model_spec(f"scripted:{script}").path == str(script)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("gpt4", "KIND:TARGET"),
        ("ollama:llama3", "unknown model kind 'ollama'"),
        ("vllm:localhost:8000", "http(s) server URLs"),
        ("openai:gpt-4o", "MODEL@BASE_URL"),
        ("local:/no/such/dir", "no config.json"),
        ("scripted:/no/such.jsonl", "does not exist"),
    ],
)
def test_bad_specs_say_what_is_accepted(spec: str, words: str) -> None:
    with pytest.raises(EvalError) as e:
        parse_model_spec(spec)
    assert words in str(e.value)


def _pass_at_k_brute(n: int, c: int, k: int) -> float:
    """Fraction of k-subsets of the n samples holding at least one correct sample."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize(("n", "c", "k"), [(1, 0, 1), (1, 1, 1), (5, 2, 1), (5, 2, 3), (8, 1, 4), (8, 7, 2), (6, 0, 6)])
def test_pass_at_k_matches_subset_enumeration(n: int, c: int, k: int) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(_pass_at_k_brute(n, c, k))


def test_pass_at_k_needs_k_samples() -> None:
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_math_summary_counts_infra_errors_apart() -> None:
    tasks = [{"id": "p1", "answer": "1"}, {"id": "p2", "answer": "2"}, {"id": "p3", "answer": "3"}]
    row = {"prediction": "", "infra_error": None}
    rows = [
        {**row, "id": "p1", "sample": 0, "correct": True},
        {**row, "id": "p1", "sample": 1, "correct": False},
        {**row, "id": "p2", "sample": 0, "correct": False},
        {**row, "id": "p2", "sample": 1, "correct": False, "infra_error": "SandboxError: gone"},
        {**row, "id": "p3", "sample": 0, "correct": False, "infra_error": "x"},
        {**row, "id": "p3", "sample": 1, "correct": False, "infra_error": "x"},
    ]
    rep = summarize(tasks, rows, 2, model="m", dataset="d", tools="none")
    assert rep["problems_graded"] == 2 and rep["infra_errors"] == 3
    assert rep["avg@2"] == pytest.approx((0.5 + 0.0) / 2)
    assert rep["pass@1"] == pytest.approx(0.25)
    assert rep["pass@2"] == pytest.approx(1.0)  # only p1 has 2 valid samples: one of them is right


def test_hub_unreachable_fails_fast_with_a_local_file_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(eval_swebench, "hub_available", lambda: False)
    t0 = time.monotonic()
    with pytest.raises(EvalError) as e:
        eval_swebench.load_swe_dataset("SWE-bench/SWE-bench_Verified")
    assert time.monotonic() - t0 < 5
    assert "not reachable" in str(e.value) and "--dataset FILE" in str(e.value)


def test_limits_default_to_what_the_model_allows() -> None:
    from sao.agent.engines.registry import CONTEXT_CAP, SpecOptions
    from sao.cli.eval_cmd import CONTEXT_HELP

    o = SpecOptions(turns_in_context=16)
    assert o.context_for(8192) == 8192  # SmolLM2's max_position_embeddings
    assert o.context_for(131072) == CONTEXT_CAP == 32768 and f"at most {CONTEXT_CAP}" in CONTEXT_HELP
    assert o.context_for(None) == CONTEXT_CAP  # a model that declares no limit
    assert o.action_for(8192) == 512 and o.action_for(CONTEXT_CAP) == 2048
    asked = SpecOptions(max_context_tokens=4096, max_action_tokens=300)
    assert asked.context_for(8192) == 4096 and asked.context_for(2048) == 2048  # never past the model's own
    assert asked.action_for(4096) == 300


def test_a_bare_alias_runs_on_vllm_and_says_how_when_vllm_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    monkeypatch.setenv("SAO_CACHE", str(tmp_path))
    with pytest.raises(EvalError, match=r"holds no model; run scripts/setup\.sh"):
        parse_model_spec("smollm2")
    from sao.core.paths import smollm2_dir

    smollm2_dir().mkdir(parents=True)
    (smollm2_dir() / "config.json").write_text("{}")
    if importlib.util.find_spec("vllm") is not None:
        assert parse_model_spec("smollm2") == parse_model_spec(f"local:{smollm2_dir()}")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(EvalError, match=r"vLLM, which is not installed.*--model hf:smollm2"):
        parse_model_spec("smollm2")
