"""`sao bench microbatch`'s default batch: heavy-tailed, observation-heavy SWE-style episodes that collate."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sao.benchmarks.bench_microbatch import MicrobatchBenchConfig, run, synthetic_trajectories, target_lengths
from sao.trainer.learn.batch import collate


def test_lengths_are_the_heavy_tailed_quantiles_in_random_order() -> None:
    lengths = target_lengths(8, 300, 3000, random.Random(0))
    assert sorted(lengths) == [316, 356, 409, 484, 597, 790, 1210, 3000]
    assert lengths != sorted(lengths)  # the batch order is not the length order
    assert all(300 <= x <= 3000 for x in target_lengths(64, 300, 3000, random.Random(1)))


def test_synthetic_episodes_are_long_uneven_and_observation_heavy(smollm2_dir: Path) -> None:
    from transformers import AutoTokenizer

    cfg = MicrobatchBenchConfig(out=Path("unused"), n=8)
    trajs = synthetic_trajectories(cfg, AutoTokenizer.from_pretrained(str(smollm2_dir)))
    targets = target_lengths(8, 300, 3000, random.Random(cfg.seed))
    for t, target in zip(trajs, targets, strict=True):
        assert target <= t.num_tokens <= target + 20  # cut at the target, a short submit call at most after it
        assert t.segments[0].kind == "prompt" and t.segments[-1].kind == "action"
        assert len(t.action_segments) >= 2
    obs = sum(len(s.token_ids) for t in trajs for s in t.segments if s.kind == "observation")
    assert obs / sum(t.num_tokens for t in trajs) > 0.7
    assert [t.reward for t in trajs[:4]] == [0.0, 1.0, 0.0, 1.0]  # not a uniform batch
    assert collate(trajs, pad_token_id=0).shape == (8, max(t.num_tokens for t in trajs))


@pytest.mark.parametrize(
    ("change", "match"),
    [({"n": 1}, "--n must be >= 2"), ({"min_tokens": 500, "max_tokens": 400}, "--min-tokens <= --max-tokens")],
)
def test_bad_settings_are_refused(tmp_path: Path, change: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        run(MicrobatchBenchConfig(out=tmp_path, **change))  # type: ignore[arg-type]
