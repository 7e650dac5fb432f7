"""One training step on tiny models under single-process DeepSpeed: which parameters move for every algorithm,
how many optimizer steps run, a registered algorithm, the sampling temperature, and bad numbers that never crash."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from sao.trainer.config import config_from_dict
from tests.integration.trainer._helpers import synthetic_trajectories

pytestmark = [pytest.mark.deepspeed]


def _snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_parameters()}


def _changed(before: dict[str, torch.Tensor], module: torch.nn.Module) -> set[str]:
    return {k for k, v in module.named_parameters() if not torch.equal(before[k], v.detach())}


def _learner(
    algorithm: str,
    kind: str = "moe",
    rollout: dict[str, Any] | None = None,
    deepspeed: dict[str, Any] | None = None,
    **trainer: object,
) -> tuple[Any, list[Any]]:
    from sao.trainer import distributed
    from sao.trainer.learn.learner import Learner
    from sao.trainer.learn.models import load_actor, load_critic

    distributed.init_distributed()
    cfg = config_from_dict(
        {
            "model": {"path": f"tiny:{kind}"},
            "trainer": {"algorithm": algorithm, "batch_size": 4, "lr": 1e-3, "group_size": 2, **trainer},
            "critic": {"lr": 1e-3},
            "rollout": rollout or {},
            "deepspeed": {"micro_batch_size": 2, **(deepspeed or {})},
        }
    )
    actor = load_actor(cfg)
    critic = load_critic(cfg, actor) if cfg.uses_critic else None
    trajs = synthetic_trajectories(actor, 4, temperature=cfg.rollout.temperature)
    return Learner(cfg, actor, critic, pad_token_id=0), trajs


def test_sao_step_moves_actor_and_only_non_attention_critic_params(deepspeed_env: dict[str, str]) -> None:
    from sao.trainer.learn.models import attention_param_names

    learner, trajs = _learner("sao", critic_updates_per_step=2)
    critic = learner.critic.module
    attn = set(attention_param_names(critic))
    assert any(".mlp.experts." in n for n in critic.state_dict()), "expected an MoE critic"
    a0, c0 = _snapshot(learner.actor.module), _snapshot(critic)
    metrics = learner.train_step(trajs)
    actor_changed = _changed(a0, learner.actor.module)
    critic_changed = _changed(c0, critic)
    assert actor_changed, "the policy step changed no actor parameter"
    assert critic_changed, "the K critic steps changed no critic parameter"
    assert not (critic_changed & attn), f"frozen attention params moved: {sorted(critic_changed & attn)[:5]}"
    assert "value_head.weight" in critic_changed
    assert any("mlp" in n for n in critic_changed), "no MoE/MLP critic parameter was trained"
    for key in ("value_loss", "explained_variance", "actor_grad_norm", "critic_grad_norm", "mask_frac_low"):
        assert key in metrics
    # rewards alternate 0/1: both outcomes are there, and the per-turn sign agreement is a fraction of each
    assert 0.0 <= metrics["adv_pos_turns_solved"] <= 1.0 and 0.0 <= metrics["adv_neg_turns_failed"] <= 1.0


@pytest.mark.parametrize("algorithm", ["grpo", "grpo_dis", "ppo", "running_mean"])
def test_every_algorithm_updates_the_actor(deepspeed_env: dict[str, str], algorithm: str) -> None:
    learner, trajs = _learner(algorithm, kind="llama")
    a0 = _snapshot(learner.actor.module)
    metrics = learner.train_step(trajs)
    assert _changed(a0, learner.actor.module), f"{algorithm}: actor unchanged after one update"
    assert (learner.critic is not None) == (algorithm == "ppo")
    assert metrics["trained_tokens"] == 4 * 6


def test_token_level_gae_with_separate_lambdas_trains_actor_and_critic(deepspeed_env: dict[str, str]) -> None:
    # the ablation: plain token GAE (through observations), actor lambda 0.9, critic targets with lambda 1
    learner, trajs = _learner("sao", kind="llama", advantage="gae", lam=0.9, critic_lam=1.0)
    assert learner.adv_traits.token_level
    a0, c0 = _snapshot(learner.actor.module), _snapshot(learner.critic.module)
    m = learner.train_step(trajs)
    assert _changed(a0, learner.actor.module) and _changed(c0, learner.critic.module)
    assert m["value_loss"] == m["value_loss"] and m["trained_tokens"] == 4 * 6


def _count_optimizer_steps(learner: Any) -> dict[str, int]:
    counts = {"actor": 0, "critic": 0}
    for name in counts:
        engine = getattr(learner, name)
        if engine is None:
            continue
        opt = engine.optimizer
        inner = opt.step

        def counted(*a: Any, _inner: Any = inner, _name: str = name, **kw: Any) -> Any:
            counts[_name] += 1
            return _inner(*a, **kw)

        opt.step = counted
    return counts


@pytest.mark.parametrize(("algorithm", "k", "epochs"), [("sao", 2, 1), ("ppo", 1, 2)])
def test_k_critic_steps_and_ppo_epochs_are_counted(
    deepspeed_env: dict[str, str], algorithm: str, k: int, epochs: int
) -> None:
    learner, trajs = _learner(algorithm, kind="llama", critic_updates_per_step=k, ppo_epochs=epochs)
    counts = _count_optimizer_steps(learner)
    calls: list[bool] = []
    inner = learner._logp

    def spy(b: Any, with_entropy: bool) -> Any:
        calls.append(with_entropy)
        return inner(b, with_entropy)

    learner._logp = spy
    m = learner.train_step(trajs)
    assert counts == {"actor": epochs, "critic": k}  # 2 micro batches accumulate into ONE optimizer step each
    n_micro = 2
    assert calls.count(False) == (n_micro if learner.spec.old_policy_recompute else 0)  # the recompute, once
    assert calls.count(True) == n_micro * epochs
    assert m["skipped_steps"] == 0 and m["critic_skipped_steps"] == 0


@pytest.mark.parametrize("order", ["advantages_first", "critic_first"])
def test_the_values_share_the_first_critic_steps_forward(deepspeed_env: dict[str, str], order: str) -> None:
    # K critic steps on 2 micro batches: the values the advantages read come from the first step's own forward,
    # so the critic runs K x 2 forwards (not 2 more for a separate values phase); critic_first recomputes the values
    # for the policy after its K steps (2 more)
    learner, trajs = _learner("sao", kind="llama", critic_updates_per_step=2, update_order=order)
    forwards = []
    inner = learner.critic.forward

    def counted(*a: Any, **kw: Any) -> Any:
        forwards.append(torch.is_grad_enabled())
        return inner(*a, **kw)

    learner.critic.forward = counted
    counts = _count_optimizer_steps(learner)
    m = learner.train_step(trajs)
    assert counts["critic"] == 2 and m["critic_skipped_steps"] == 0
    assert forwards.count(True) == 2 * 2
    assert forwards.count(False) == (2 if order == "critic_first" else 0)


def test_an_algorithm_registered_outside_the_package_trains(deepspeed_env: dict[str, str]) -> None:
    from sao.trainer.algos.registry import ALGORITHMS

    if "reinforce_rm" not in ALGORITHMS:
        doc = (Path(__file__).resolve().parents[3] / "docs" / "register_algorithm.md").read_text()
        code = re.findall(r"```python\n(.*?)```", doc, re.S)
        assert len(code) == 1
        exec(compile(code[0], "register_algorithm.md", "exec"), {})
    learner, trajs = _learner("reinforce_rm", kind="llama")
    assert learner.critic is None and learner.spec.policy_loss == "reinforce"
    a0 = _snapshot(learner.actor.module)
    counts = _count_optimizer_steps(learner)
    m = learner.train_step(trajs)
    assert counts["actor"] == 1 and _changed(a0, learner.actor.module)
    assert m["trained_tokens"] == 4 * 6


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_the_recompute_uses_the_sampling_temperature(deepspeed_env: dict[str, str], temperature: float) -> None:
    # rollout logprobs taken at the rollout temperature: the learner's first recompute must match them (ratio 1)
    learner, trajs = _learner("sao", kind="llama", rollout={"temperature": temperature})
    m = learner.train_step(trajs)
    assert m["logp_diff_abs_mean"] < 1e-4, m["logp_diff_abs_mean"]
    assert m["kept_frac"] == 1.0


def _poison(traj: Any, **change: Any) -> Any:
    import dataclasses

    return dataclasses.replace(traj, **change)


@pytest.mark.parametrize("algorithm", ["sao", "running_mean"])
def test_bad_rewards_and_rollout_logprobs_are_masked_and_counted(deepspeed_env: dict[str, str], algorithm: str) -> None:
    import dataclasses

    learner, trajs = _learner(algorithm, kind="llama")
    segs = list(trajs[0].segments)
    lps = list(segs[1].logprobs)
    lps[0] = float("-inf")
    segs[1] = dataclasses.replace(segs[1], logprobs=tuple(lps))
    lps = list(segs[3].logprobs)
    lps[1] = float("nan")
    segs[3] = dataclasses.replace(segs[3], logprobs=tuple(lps))
    trajs[0] = _poison(trajs[0], segments=tuple(segs))
    trajs[1] = _poison(trajs[1], reward=float("nan"))
    a0 = _snapshot(learner.actor.module)
    m = learner.train_step(trajs)
    assert m["masked_nonfinite_tokens"] == 2
    assert m["nonfinite_rewards"] == 1
    assert m["trained_tokens"] == 4 * 6 - 2 - 6  # two masked tokens, one whole trajectory
    assert m["skipped_steps"] == 0 and _changed(a0, learner.actor.module)
    assert all(v == v for k, v in m.items() if k in ("pg_loss", "value_loss", "actor_grad_norm")), m
    if not learner.spec.critic:  # the bad trajectory stays out of the reward baseline
        assert learner.baseline.count == 3 and learner.baseline.mean == pytest.approx(0.1)  # EMA 0.9 of 0, 0, 1


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_a_nonfinite_gradient_skips_the_step_and_the_run_goes_on(
    deepspeed_env: dict[str, str], zero_stage: int
) -> None:
    learner, trajs = _learner("sao", kind="llama", deepspeed={"zero_stage": zero_stage})
    loss_fn = learner.loss_fn
    learner.loss_fn = lambda x: (lambda out: (out[0] * float("nan"), out[1]))(loss_fn(x))
    a0 = _snapshot(learner.actor.module)
    m = learner.train_step(trajs)
    assert m["skipped_steps"] == 1
    assert not _changed(a0, learner.actor.module), "a NaN gradient was applied"
    assert all(bool(torch.isfinite(p).all()) for p in learner.actor.module.parameters())
    assert learner.params_finite()
    learner.loss_fn = loss_fn  # the next step is healthy and trains
    m = learner.train_step(trajs)
    assert m["skipped_steps"] == 0 and _changed(a0, learner.actor.module)


def test_nonfinite_critic_values_skip_the_whole_step(deepspeed_env: dict[str, str]) -> None:
    learner, trajs = _learner("sao", kind="llama")
    values = learner._values
    learner._values = lambda b, slot=None: tuple(x * float("nan") for x in values(b, slot))
    a0, c0 = _snapshot(learner.actor.module), _snapshot(learner.critic.module)
    counts = _count_optimizer_steps(learner)
    skipped0 = learner.critic.skipped_steps
    m = learner.train_step(trajs)
    assert m["nonfinite_values"] > 0 and m["skipped_steps"] == 1
    # the first critic step shares the values' forward: its gradient is made non-finite once the bad values are
    # known, so the optimizer skips it (no update, no moments); no further critic step runs
    assert counts == {"actor": 0, "critic": 1} and learner.critic.skipped_steps == skipped0 + 1
    assert not _changed(a0, learner.actor.module) and not _changed(c0, learner.critic.module)


def test_a_batch_with_nothing_trainable_takes_no_optimizer_step(deepspeed_env: dict[str, str]) -> None:
    learner, trajs = _learner("sao", kind="llama")
    counts = _count_optimizer_steps(learner)
    a0 = _snapshot(learner.actor.module)
    m = learner.train_step([_poison(tr, reward=float("inf")) for tr in trajs])
    assert m["nonfinite_rewards"] == 4 and m["trained_tokens"] == 0
    assert m["skipped_steps"] == 1 and m["critic_skipped_steps"] == learner.cfg.trainer.critic_updates_per_step
    assert counts == {"actor": 0, "critic": 0} and not _changed(a0, learner.actor.module)


def test_a_keyed_running_mean_scores_each_episode_against_its_level(deepspeed_env: dict[str, str]) -> None:
    import dataclasses

    # trainer.baseline_key: episodes 0-1 are level 1, 2-3 level 2 (rewards 0, 1, 0, 1); after one step each level
    # holds its own mean; a batch all of level 1 moves level 1's alone; an episode without a level is refused
    learner, trajs = _learner("running_mean", kind="llama", baseline_key="level", running_mean_momentum=0.0)
    trajs = [dataclasses.replace(t, info={**t.info, "level": 1 + i // 2}) for i, t in enumerate(trajs)]
    learner.train_step(trajs)
    assert learner.baseline.by_key == {"1": (pytest.approx(0.5), 2), "2": (pytest.approx(0.5), 2)}
    solved = [dataclasses.replace(t, info={**t.info, "level": 1}) for t in trajs]
    m = learner.train_step(solved)
    assert learner.baseline.by_key["1"][1] == 6 and learner.baseline.by_key["2"][1] == 2
    assert m["trained_tokens"] == 4 * 6
    with pytest.raises(Exception, match="no 'level'"):
        learner.train_step([dataclasses.replace(t, info={}) for t in trajs])
