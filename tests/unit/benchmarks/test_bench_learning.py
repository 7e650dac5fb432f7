"""Small pieces of `sao bench learning`: smoothing, thresholds, the seed summary, post-shift success, per-run
configs for every shipped (task, variant), bench-only algorithms, bad input."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sao.benchmarks.bench_learning import (
    LearningConfig,
    first_reach,
    post_shift_success,
    run,
    run_config,
    run_curves,
    smoothed,
    summarize_runs,
    task_variants,
)
from sao.benchmarks.rl_bench_common import mean_std
from sao.core.config import load_yaml, merge

ROOT = Path(__file__).resolve().parents[3]
SPEC = ROOT / "configs/bench/learning.yaml"


def test_smoothing_and_first_reach() -> None:
    assert smoothed([0.0, 1.0, 0.5, 1.0], 2) == [0.0, 0.5, 0.75, 0.75]
    assert first_reach([0.1, 0.4, 0.6, 0.9], 0.5) == 2
    assert first_reach([0.1, 0.2], 0.5) is None


def _rows(success: list[float], ev: list[float | None]) -> list[dict[str, object]]:
    return [
        {"step": i + 1, "success_rate": s, "reward_mean": s, "step_s": 2.0, "explained_variance": e,
         "generated": 16 * (i + 1), "mask_frac_low": 0.1}
        for i, (s, e) in enumerate(zip(success, ev, strict=True))
    ]  # fmt: skip


def test_curves_and_summary_over_seeds() -> None:
    c = run_curves(_rows([0.0, 0.2, 0.8, 1.0, 1.0], [None, 0.1, 0.3, 0.5, 0.7]))
    assert c["time_s"] == [2.0, 4.0, 6.0, 8.0, 10.0]
    assert math.isnan(c["explained_variance"][0]) and c["explained_variance"][-1] == 0.7
    assert c["mask_frac_low"] == [0.1] * 5 and all(math.isnan(x) for x in c["critic_grad_norm"])
    flat = run_curves(_rows([0.0] * 5, [None] * 5))
    s = summarize_runs([c, flat], threshold=0.5, smooth=1, final_frac=0.4)
    assert s["final_success_per_seed"] == [1.0, 0.0]
    assert (s["final_success_mean"], s["final_success_std"]) == pytest.approx(mean_std([1.0, 0.0]))
    assert s["reached"] == 1 and s["steps_to_threshold_mean"] == 3.0 and s["seconds_to_threshold_mean"] == 6.0
    assert s["final_explained_variance_mean"] == pytest.approx(0.6)
    assert math.isnan(s["post_shift_success_mean"])


def test_post_shift_success_reads_the_steps_after_each_shift() -> None:
    # 16 episodes per step, a shift every 32 episodes: shifts land at steps 2, 4, 6 (0-based 1, 3, 5).
    c = run_curves(_rows([1.0, 0.0, 0.5, 0.0, 1.0, 0.25, 0.75, 1.0], [None] * 8))
    assert post_shift_success(c, shift_every=32, window=2) == [0.25, 0.5, 0.5]
    assert post_shift_success(c, shift_every=32, window=3) == pytest.approx([1 / 6, 5 / 12, 2 / 3])
    assert post_shift_success(c, shift_every=32, window=4) == [0.375, 0.5]  # the third window would run past the end
    s = summarize_runs([c], threshold=0.9, smooth=1, final_frac=0.25, shift=(32, 2))
    assert s["post_shift_success_mean"] == pytest.approx((0.25 + 0.5 + 0.5) / 3)


def test_every_shipped_run_config_is_a_valid_trainer_config(tmp_path: Path) -> None:
    from sao.trainer.config import config_from_dict

    spec = load_yaml(SPEC)
    assert set(spec["tasks"]) == {
        "main",
        "difficulty",
        "difficulty_symbol",
        "credit",
        "multiturn",
        "latency",
        "online_writing",
    }
    assert all("warm_start" in spec["families"][spec["tasks"][t]["family"]] for t in spec["tasks"])
    assert {"sao", "sao_k1", "sao_full_critic", "running_mean", "sao_token_gae", "grpo", "grpo_dis", "ppo"} <= set(
        task_variants(spec, "main")
    )
    schedules = set()
    for task in spec["tasks"]:
        assert spec["tasks"][task]["family"] in spec["families"]
        for variant in task_variants(spec, task):
            cfg = config_from_dict(run_config(spec, task, variant, 1, 5, tmp_path, 64, model_path=str(tmp_path)))
            assert cfg.run.seed == 1 and cfg.run.total_steps == 5 and cfg.model.tokenizer == str(tmp_path)
            assert cfg.model.path == str(tmp_path)
            if cfg.env.id == "sao/OnlineWriting-v0":
                schedules.add(cfg.env.kwargs["schedule"])
    assert len(schedules) == len(task_variants(spec, "online_writing"))  # no two runs share the judge's counter

    def one(variant: str, task: str = "main") -> object:
        return config_from_dict(run_config(spec, task, variant, 0, 5, tmp_path, 64))

    k1, full, tok, ppo = one("sao_k1"), one("sao_full_critic"), one("sao_token_gae"), one("ppo")
    assert k1.trainer.critic_updates_per_step == 1 and not full.critic.freeze_attention  # type: ignore[attr-defined]
    assert tok.trainer.advantage == "gae"  # type: ignore[attr-defined]
    assert ppo.trainer.ppo_epochs > 1 and ppo.trainer.behavior_weight_cap is not None  # type: ignore[attr-defined]
    assert one("sao_nocorr", "latency").trainer.algorithm == "sao_nocorr"  # type: ignore[attr-defined]
    # the multi-turn task is where skip-observation GAE can differ from Monte-Carlo: lambda < 1
    assert one("sao", "multiturn").trainer.lam < 1  # type: ignore[attr-defined]


def test_grouped_batches_are_rounded_to_whole_groups(tmp_path: Path) -> None:
    spec = merge(load_yaml(SPEC), {"base": {"trainer": {"batch_size": 10}}})
    assert run_config(spec, "main", "grpo", 0, 5, tmp_path, 64)["trainer"]["batch_size"] == 8
    assert run_config(spec, "main", "grpo_dis", 0, 5, tmp_path, 64)["trainer"]["batch_size"] == 8
    assert run_config(spec, "main", "sao", 0, 5, tmp_path, 64)["trainer"]["batch_size"] == 10


def test_no_correction_loss_ignores_the_ratio() -> None:
    """The bench's 'no correction' arm: gradient -A/N on logp whatever the rollout logprob (DIS would mask)."""
    import torch

    from sao.benchmarks.rl_bench_common import register_bench_algorithms
    from sao.trainer.algos.registry import PolicyLossInputs, get_algorithm, get_policy_loss

    register_bench_algorithms()
    register_bench_algorithms()  # idempotent
    assert get_algorithm("grpo_async").grouped and not get_algorithm("grpo_async").synchronous
    logp = torch.tensor([[0.0, -0.1, -2.0]], requires_grad=True)
    x = PolicyLossInputs(
        logp=logp,
        rollout_logp=torch.tensor([[0.0, -3.0, -0.1]]),  # ratios e^2.9 and e^-1.9: both outside a DIS band
        advantages=torch.tensor([[0.0, 1.0, -2.0]]),
        action_mask=torch.tensor([[False, True, True]]),
    )
    loss, _ = get_policy_loss(get_algorithm("sao_nocorr").policy_loss)(x)
    loss.backward()
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([0.0, -0.5, 1.0])
    dis_logp = logp.detach().clone().requires_grad_(True)
    dis, _ = get_policy_loss("dis")(PolicyLossInputs(**{**x.__dict__, "logp": dis_logp, "eps_low": 0.5}))
    dis.backward()
    assert dis_logp.grad is not None and dis_logp.grad.abs().sum() == 0  # DIS masks both tokens


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"variants": ("sao", "nope")}, "unknown variant"),
        ({"tasks": ("chess",)}, "unknown task"),
        ({"seeds": ()}, "seed"),
    ],
)
def test_bad_selection_is_refused_before_any_run(tmp_path: Path, kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        run(LearningConfig(out=tmp_path / "out", config=SPEC, **kw))  # type: ignore[arg-type]
    assert not (tmp_path / "out" / "runs").exists()


def test_missing_config_file_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="configs/bench"):
        run(LearningConfig(out=tmp_path, config=tmp_path / "missing.yaml"))


def test_demonstrations_follow_the_oracle_settings(tmp_path: Path) -> None:
    """Chat demonstrations for the warm start: right on copy prompts, never right on next prompts here."""
    import json

    from sao.benchmarks.rl_bench_common import write_demonstrations

    kw = {"turns": 2, "symbols": "ABC", "rule": "mixed", "reward": "partial"}
    spec = {"accuracy_by_rule": {"copy": 1.0, "next": 0.0}}
    n = write_demonstrations(tmp_path / "d.jsonl", "sao/TokenGame-v0", kw, 40, spec, seed=3)
    recs = [json.loads(x) for x in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert n == len(recs) == 40
    rules = set()
    for rec in recs:
        msgs = rec["messages"]
        assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
        rule = "next" if "Rule next" in msgs[1]["content"] else "copy"
        rules.add(rule)
        shown = [msgs[1]["content"][-1], msgs[3]["content"][-1]]
        right = shown if rule == "copy" else ["ABC"[("ABC".index(s) + 1) % 3] for s in shown]
        answers = [msgs[2]["content"], msgs[4]["content"]]
        assert (answers == right) if rule == "copy" else all(a != r for a, r in zip(answers, right, strict=True))
    assert rules == {"copy", "next"}
    only_copy = write_demonstrations(tmp_path / "c.jsonl", "sao/TokenGame-v0", kw, 40, {"rules": ["copy"]}, seed=3)
    assert 0 < only_copy < 40


def test_map_runs_calls_in_worker_processes_in_order() -> None:
    """``--jobs``: results come back in call order whatever order the workers finish in; progress per call."""
    from sao.benchmarks.rl_bench_common import map_in_workers as _map

    seen: list[int] = []
    assert _map(pow, [(2, 3), (3, 2), (5, 1)], 2, lambda i, _: seen.append(i)) == [8, 9, 5]
    assert sorted(seen) == [0, 1, 2]
    assert _map(pow, [(2, 2)], 1, lambda i, r: seen.append(r)) == [4] and seen[-1] == 4


def test_bad_jobs_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--jobs"):
        run(LearningConfig(out=tmp_path, config=SPEC, jobs=0))


def test_demonstrations_can_be_right_more_often_on_one_symbol(tmp_path: Path) -> None:
    """``accuracy_by_symbol``: prompts of different difficulty where the shown symbol decides it."""
    import json

    from sao.benchmarks.rl_bench_common import write_demonstrations

    kw = {"turns": 1, "symbols": "AB", "rule": "copy", "reward": "all"}
    skew = {"accuracy_by_symbol": {"A": 1.0, "B": 0.0}}
    write_demonstrations(tmp_path / "d.jsonl", "sao/TokenGame-v0", kw, 200, skew, 1)
    recs = [json.loads(x)["messages"] for x in (tmp_path / "d.jsonl").read_text().splitlines()]
    shown = [m[1]["content"][-1] for m in recs]
    assert {"A", "B"} == set(shown)
    assert all(m[2]["content"] == "A" for m in recs)  # right on every A prompt, wrong (= A) on every B prompt
