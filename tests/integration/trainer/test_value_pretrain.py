"""`sao pretrain-value`: trains only the critic on saved trajectories and writes a checkpoint critic.init loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from sao.agent.records import write_jsonl
from tests.integration.trainer._helpers import synthetic_trajectories

pytestmark = [pytest.mark.deepspeed]


def test_pretrained_critic_is_loadable_and_fits_the_returns(
    tmp_path: Path, deepspeed_env: dict[str, str], smollm2_dir: Path
) -> None:
    from sao.core.tiny_models import build_tiny_model
    from sao.trainer.config import load_config
    from sao.trainer.learn.models import load_actor, load_critic
    from sao.trainer.learn.value_pretrain import pretrain_value

    rollouts = tmp_path / "rollouts.jsonl"
    write_jsonl(rollouts, synthetic_trajectories(build_tiny_model("llama"), 16))
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(
        yaml.safe_dump(
            {
                "run": {"dir": str(tmp_path / "run")},
                "model": {"path": "tiny:llama"},
                "critic": {"lr": 3e-3},
                "trainer": {"batch_size": 8},
                "deepspeed": {"micro_batch_size": 4},
            }
        )
    )
    out = pretrain_value(str(cfg_path), str(rollouts), epochs=3)
    assert (out / "value_head.safetensors").exists() and (out / "config.json").exists()
    cfg = load_config(cfg_path, [f"critic.init={out}"])
    fresh_cfg = load_config(cfg_path)
    actor = load_actor(fresh_cfg)
    loaded, fresh = load_critic(cfg, actor), load_critic(fresh_cfg, actor)
    assert not torch.equal(loaded.value_head.weight, fresh.value_head.weight)
    # The attention weights were frozen during pretraining: they still equal the actor's.
    a = dict(actor.named_parameters())
    for name, p in loaded.named_parameters():
        if ".self_attn." in name:
            assert torch.equal(p, a["model." + name[len("backbone.") :]]), name


def _marked_trajectories(n: int) -> list[Any]:
    """Two-turn trajectories whose reward is written in the prompt (its first token 7 -> 1, 9 -> 0): a critic can
    learn it, so its explained variance on held-out tasks must rise above 0."""
    from sao.agent.records import Segment, Trajectory

    out = []
    for i in range(n):
        reward = float(i % 2)
        mark = 7 if reward else 9
        prompt = [mark, 11 + i % 5, 12, 13]
        segs = (
            Segment("prompt", prompt),
            Segment("action", [20, 21, 22], [-1.0, -1.0, -1.0], 0, None),
            Segment("observation", [30, 31]),
            Segment("action", [23, 24], [-1.0, -1.0], 0, reward),
        )
        out.append(Trajectory(f"task{i}", "test", segs, reward, info={"solved": bool(reward)}))
    return out


def test_fit_critic_reports_held_out_explained_variance_above_zero(
    tmp_path: Path, deepspeed_env: dict[str, str]
) -> None:
    """The pretrain_value stage's core: a fit on whole tasks, the explained variance on tasks it never saw before
    (a fresh value head: about 0 or below) and after (clearly above 0)."""
    from sao.trainer.config import config_from_dict
    from sao.trainer.learn.value_pretrain import fit_critic, split_by_task

    cfg = config_from_dict(
        {
            "run": {"dir": str(tmp_path / "run")},
            "model": {"path": "tiny:llama"},
            "critic": {"lr": 3e-3},
            "trainer": {"batch_size": 8},
            "deepspeed": {"micro_batch_size": 8},
        }
    )
    fit, held = split_by_task(_marked_trajectories(48), 0.25, seed=0)
    assert len(held) == 12 and not {t.task_id for t in fit} & {t.task_id for t in held}
    res = fit_critic(cfg, fit, held, epochs=6, lr=3e-3, out=tmp_path / "value_init")
    assert res["held_out_ev_before"] < 0.2
    assert res["held_out_ev_after"] > 0.5, res["curve"]
    assert res["critic_steps"] == 6 * (36 // 8)  # whole batches only
    assert (tmp_path / "value_init" / "value_head.safetensors").exists()


def test_fit_critic_ridge_head_reads_the_frozen_features_before_any_step(
    tmp_path: Path, deepspeed_env: dict[str, str]
) -> None:
    """``pretrain_value.head_fit: ridge``: the head fitted by least squares on the critic's features before the
    gradient steps already predicts held-out returns that a random head cannot; ``none`` leaves the random head."""
    from sao.trainer.config import config_from_dict
    from sao.trainer.learn.value_pretrain import fit_critic, split_by_task

    def cfg(head: str) -> Any:
        return config_from_dict({"run": {"dir": str(tmp_path / "run")}, "model": {"path": "tiny:llama"},
                                 "critic": {"lr": 1e-5}, "trainer": {"batch_size": 8},
                                 "pretrain_value": {"head_fit": head},
                                 "deepspeed": {"micro_batch_size": 8}})  # fmt: skip

    fit, held = split_by_task(_marked_trajectories(48), 0.25, seed=0)
    ridge = fit_critic(cfg("ridge"), fit, held, epochs=1, lr=1e-5, out=tmp_path / "ridge")
    plain = fit_critic(cfg("none"), fit, held, epochs=1, lr=1e-5, out=tmp_path / "none")
    head = ridge["head_fit"]
    assert plain["head_fit"] is None
    assert ridge["held_out_ev_before"] == pytest.approx(plain["held_out_ev_before"])  # the same random head first
    assert head["held_out_ev"] > 0.5 > plain["held_out_ev_after"], (head, plain["curve"])
    assert head["cv_mse"] < head["mean_mse"]  # out of fold, the features beat a constant
    assert ridge["held_out_ev_after"] > 0.5


def test_a_head_only_critic_trains_its_head_and_leaves_the_backbone_as_it_was(
    tmp_path: Path, deepspeed_env: dict[str, str]
) -> None:
    """``critic.train_backbone: false``: the critic's steps move the value head alone (the written backbone is the
    actor's, bit for bit), read at turn starts (``critic.value_positions: turn``)."""
    from sao.trainer.config import config_from_dict
    from sao.trainer.learn.models import load_actor, load_critic
    from sao.trainer.learn.value_pretrain import fit_critic, split_by_task

    cfg = config_from_dict({"run": {"dir": str(tmp_path / "run")}, "model": {"path": "tiny:llama"},
                            "critic": {"lr": 3e-3, "train_backbone": False, "value_positions": "turn"},
                            "trainer": {"batch_size": 8}, "deepspeed": {"micro_batch_size": 8}})  # fmt: skip
    fresh = load_critic(cfg, load_actor(cfg))
    assert [n for n, p in fresh.named_parameters() if p.requires_grad] == ["value_head.weight", "value_head.bias"]
    fit, held = split_by_task(_marked_trajectories(48), 0.25, seed=0)
    res = fit_critic(cfg, fit, held, epochs=2, lr=3e-3, out=tmp_path / "value_init")
    assert res["critic_steps"] == 2 * (36 // 8) and res["head_fit"]["held_out_ev"] > 0.5
    trained = load_critic(config_from_dict({**cfg.to_dict(), "critic": {"init": str(tmp_path / "value_init")}}),
                          load_actor(cfg))  # fmt: skip
    for (name, a), b in zip(fresh.backbone.state_dict().items(), trained.backbone.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert res["held_out_ev_after"] != pytest.approx(res["head_fit"]["held_out_ev"])  # the steps moved the head
