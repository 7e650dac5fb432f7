"""Critic warm-up (``trainer.critic_warmup_steps``) in a whole toy run: N critic-only batches before the first
policy step, counted in optimizer steps; and the critic's own gradient clip reaches its DeepSpeed engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = [pytest.mark.deepspeed]
ROOT = Path(__file__).resolve().parents[3]
SMALL = [
    "env.kwargs={turns: 2, symbols: ABC, rule: copy, reward: all}",
    "trainer.batch_size=4",
    "deepspeed.micro_batch_size=2",
    "rollout.concurrency=4",
    "rollout.buffer_size=4",
    "run.progress=false",
    "run.plot=false",
    "run.tensorboard=false",
    "trainer.skip_uniform_reward_batches=false",  # every policy step steps, so the count below is exact
    "trainer.entropy_coef=0.3",  # a uniform batch still has a gradient: no zero-advantage skip either
]


def test_warmup_batches_train_only_the_critic_and_are_counted(
    tmp_path: Path, deepspeed_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """3 warm-up batches then 2 policy steps at K = 2: the critic steps (3 + 2) x 2 = 10 times, the actor twice,
    and the policy version moves only with the policy steps (the warm-up batches are all version 0)."""
    from sao.trainer.learn import learner as learner_mod
    from sao.trainer.runs.run import train

    counts = {"actor": 0, "critic": 0}
    policies: list[bool] = []
    init, step = learner_mod.Learner.__init__, learner_mod.Learner.train_step

    def counting_init(self: Any, *a: Any, **kw: Any) -> None:
        init(self, *a, **kw)
        for name in counts:
            opt = getattr(self, name).optimizer
            inner = opt.step

            def counted(*x: Any, _inner: Any = inner, _name: str = name, **k: Any) -> Any:
                counts[_name] += 1
                return _inner(*x, **k)

            opt.step = counted

    def spy_step(self: Any, trajs: Any, policy: bool = True, episodes: Any = None) -> Any:
        policies.append(policy)
        return step(self, trajs, policy, episodes)

    monkeypatch.setattr(learner_mod.Learner, "__init__", counting_init)
    monkeypatch.setattr(learner_mod.Learner, "train_step", spy_step)
    run = train(
        str(ROOT / "configs/toy.yaml"),
        [f"run.dir={tmp_path / 'run'}", "run.total_steps=2", "trainer.critic_warmup_steps=3",
         "trainer.critic_updates_per_step=2", *SMALL],
    )  # fmt: skip
    assert policies == [False, False, False, True, True]
    assert counts == {"critic": 10, "actor": 2}
    warm = [json.loads(x) for x in (run / "critic_warmup.jsonl").read_text().splitlines()]
    assert [w["critic_warmup_step"] for w in warm] == [1, 2, 3]
    assert all(w["critic_warmup"] == 1.0 and w["trained_tokens"] == 0.0 for w in warm)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and [r["version"] for r in rows] == [1, 2]
    state = json.loads((run / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    assert state["critic_warmup_done"] == 3
    # every warm-up trajectory was sampled by version 0 and trained once: the books balance
    ledger = [json.loads(x) for x in (run / "trajectories.jsonl").read_text().splitlines()]
    trained = [r for r in ledger if r.get("type") == "event" and r.get("event") == "trained"]
    assert sum(r["step"] == 0 for r in trained) == 3 * 4 and sum(r["step"] > 0 for r in trained) == 2 * 4


def test_warmup_is_refused_for_an_algorithm_without_a_critic() -> None:
    from sao.trainer.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="critic_warmup_steps"):
        load_config(ROOT / "configs/toy.yaml", ["trainer.algorithm=running_mean", "trainer.critic_warmup_steps=2"])


def test_the_critic_has_its_own_gradient_clip(deepspeed_env: dict[str, str]) -> None:
    from sao.trainer import distributed
    from sao.trainer.config import config_from_dict
    from sao.trainer.learn.learner import Learner
    from sao.trainer.learn.models import load_actor, load_critic

    distributed.init_distributed()
    cfg = config_from_dict(
        {
            "model": {"path": "tiny:llama"},
            "critic": {"gradient_clipping": 7.5},
            "trainer": {"batch_size": 2},
            "deepspeed": {"gradient_clipping": 1.0, "micro_batch_size": 2},
        }
    )
    actor = load_actor(cfg)
    learner = Learner(cfg, actor, load_critic(cfg, actor), pad_token_id=0)
    assert learner.actor.gradient_clipping() == 1.0
    assert learner.critic is not None and learner.critic.gradient_clipping() == 7.5


def test_a_head_only_turn_critic_steps_through_the_learner(deepspeed_env: dict[str, str]) -> None:
    # `critic.train_backbone: false` with `value_positions: turn`: a whole SAO step (values, advantages, policy
    # step, K critic steps) runs, the critic's backbone does not move and its head does
    from sao.trainer import distributed
    from sao.trainer.config import config_from_dict
    from sao.trainer.learn.learner import Learner
    from sao.trainer.learn.models import load_actor, load_critic
    from tests.integration.trainer._helpers import synthetic_trajectories

    distributed.init_distributed()
    cfg = config_from_dict(
        {
            "model": {"path": "tiny:llama"},
            "critic": {"train_backbone": False, "value_positions": "turn", "lr": 1e-2},
            "trainer": {"batch_size": 4, "critic_updates_per_step": 2},
            "deepspeed": {"micro_batch_size": 4},
        }
    )
    actor = load_actor(cfg)
    critic = load_critic(cfg, actor)
    backbone0 = {k: v.clone() for k, v in critic.backbone.state_dict().items()}
    head0 = critic.value_head.weight.detach().clone()
    learner = Learner(cfg, actor, critic, pad_token_id=0)
    learner.train_step(synthetic_trajectories(actor, 4))
    assert all(torch.equal(backbone0[k], v) for k, v in critic.backbone.state_dict().items())
    assert not torch.equal(head0, critic.value_head.weight.detach())


def test_a_head_only_critic_reads_its_frozen_features_once_a_step_and_steps_the_same(
    deepspeed_env: dict[str, str],
) -> None:
    # K critic steps on a frozen backbone: the backbone runs once per micro batch per step (the values' forward),
    # the other K - 1 steps read the features it kept, and the head lands on the same weights as when every step
    # runs the backbone again (which is what `_head_only = False` makes the learner do)
    import copy

    from sao.trainer import distributed
    from sao.trainer.config import config_from_dict
    from sao.trainer.learn.learner import Learner
    from sao.trainer.learn.models import load_actor, load_critic
    from tests.integration.trainer._helpers import synthetic_trajectories

    distributed.init_distributed()
    cfg = config_from_dict(
        {
            "model": {"path": "tiny:llama"},
            "critic": {"train_backbone": False, "lr": 1e-2},
            "trainer": {"batch_size": 4, "critic_updates_per_step": 3},
            "deepspeed": {"micro_batch_size": 2},
        }
    )
    actor = load_actor(cfg)
    critic = load_critic(cfg, actor)
    trajs = synthetic_trajectories(actor, 4)
    heads, calls = [], []
    for cache in (True, False):
        a, c = copy.deepcopy(actor), copy.deepcopy(critic)
        n = [0]
        c.backbone.register_forward_hook(lambda *_, n=n: n.__setitem__(0, n[0] + 1))
        learner = Learner(cfg, a, c, pad_token_id=0)
        learner._head_only = cache
        learner.train_step(trajs)
        heads.append(c.value_head.weight.detach().clone())
        calls.append(n[0])
    micro = len(learner._features)
    assert micro == 2
    assert calls == [micro, 3 * micro]  # K = 3: one backbone forward a micro batch, against three
    assert torch.equal(heads[0], heads[1])
    assert not torch.equal(heads[0], critic.value_head.weight.detach())  # the head did step
