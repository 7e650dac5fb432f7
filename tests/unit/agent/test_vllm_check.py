"""The connect check of servers given by URL: which servers a run may sample from, from what they say or measure."""

from __future__ import annotations

from sao.agent.engines.vllm_check import ServerFacts, probe_verdict, refusals

IDS = (12, 34, 56)


def facts(**kw: object) -> ServerFacts:
    base: dict[str, object] = {"url": "http://h:8000", "model": "/models/sft", "max_model_len": 4096,
                               "probe_ids": IDS, "logprobs_mode": "processed_logprobs"}  # fmt: skip
    return ServerFacts(**{**base, **kw})  # type: ignore[arg-type]


def why(f: ServerFacts, temperature: float = 0.7) -> list[str]:
    return refusals(f, temperature=temperature, expected_ids=IDS, max_context_tokens=2048, model="/models/sft")


def test_a_server_reporting_processed_logprobs_of_the_trainers_model_is_accepted() -> None:
    assert why(facts()) == []
    assert why(facts(logprobs_mode=None, probe="processed")) == []


def test_raw_logprobs_are_refused_at_a_temperature_other_than_one_with_the_fix() -> None:
    (msg,) = why(facts(logprobs_mode="raw_logprobs"))
    assert "rollout.temperature=0.7" in msg and "--logprobs-mode processed_logprobs" in msg and "h:8000" in msg
    (msg,) = why(facts(logprobs_mode=None, probe="raw"))
    assert "measured" in msg
    assert why(facts(logprobs_mode="raw_logprobs"), temperature=1.0) == []  # the same distribution at 1.0


def test_logits_modes_and_an_unknown_mode_are_refused() -> None:
    assert "logits, not logprobs" in why(facts(logprobs_mode="processed_logits"), temperature=1.0)[0]
    assert "could not be read" in why(facts(logprobs_mode=None, probe=None))[0]


def test_another_model_or_too_short_a_context_is_refused() -> None:
    (msg,) = why(facts(probe_ids=(1, 2)))
    assert "another model" in msg and "model.path" in msg
    (msg,) = why(facts(max_model_len=1024))
    assert "max_model_len 1024 < rollout.max_context_tokens 2048" in msg


def test_the_probe_tells_raw_from_processed_only_on_tokens_that_carry_information() -> None:
    raw = [-2.0, -0.7, -0.01, -4.5]
    assert probe_verdict([-2.0, -0.7, -0.3, -4.5000001], raw) == "raw"
    assert probe_verdict([-1.2, -0.5, -0.01, -2.6], raw) == "processed"  # temperature 2 flattens each of them
    assert probe_verdict([-0.3, -0.2], [-0.001, -0.02]) is None  # the model was sure of both: nothing to compare
