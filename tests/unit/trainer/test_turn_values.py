"""``critic.value_positions: turn``: the critic is read and trained at the states where a turn begins (and after
each turn's action), and every action token of a turn is credited against its turn start's value; the same
positions in RL, value pretraining (its targets, its head fit) and the critic probe."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sao.agent.records import Segment, Trajectory
from sao.core.config import ConfigError
from sao.trainer.algos.registry import advantage_traits, get_advantage
from sao.trainer.config import load_config
from sao.trainer.learn import value_pretrain
from sao.trainer.learn.batch import Batch, collate
from sao.trainer.learn.learner import Learner
from sao.trainer.learn.models import shifted_values
from sao.trainer.learn.targets import critic_mask, turn_start, turn_values, value_mask
from sao.trainer.runs.critic_probe import first_action_values

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
# prompt (2), action (2), observation (1), action (2), observation (2): tokens 0-8; actions at 2, 3 and 5, 6
SEGS = (
    Segment("prompt", (1, 2)),
    Segment("action", (3, 4), (-0.1, -0.2), 0, 0.0),
    Segment("observation", (5,)),
    Segment("action", (6, 7), (-0.1, -0.2), 0, None),
    Segment("observation", (8, 9)),
)


def _batch(rewards: tuple[float, ...] = (1.0, 0.0)) -> Batch:
    return collate([Trajectory(f"t{i}", "e", SEGS, r, "ok") for i, r in enumerate(rewards)], 0)


def raw_critic(b: Batch) -> torch.Tensor:
    """Raw outputs, different at every position (a value read at the wrong token shows)."""
    return 0.1 + 0.05 * torch.arange(b.shape[1], dtype=torch.float32).expand(b.shape).clone()


def test_turn_positions_are_each_turn_start_and_the_state_after_each_action() -> None:
    b = _batch()
    assert turn_start(b)[0].nonzero().flatten().tolist() == [2, 5]
    assert value_mask(b, "turn")[0].nonzero().flatten().tolist() == [2, 4, 5, 7]
    assert value_mask(b, "token").equal(critic_mask(b))
    with pytest.raises(ValueError, match="value_positions"):
        value_mask(b, "tokens")


def test_every_action_token_takes_its_turn_starts_value() -> None:
    b = _batch()
    v = shifted_values(raw_critic(b))
    tv = turn_values(v, b)
    assert tv[0, 3] == v[0, 2] and tv[0, 6] == v[0, 5]
    assert tv[0, 2] == v[0, 2] and tv[0, 5] == v[0, 5]
    keep = ~b.action_mask
    assert tv[keep].equal(v[keep])  # prompt, observations and the after-action states keep their own


def test_lambda_one_credits_each_turn_against_its_start() -> None:
    # the learner's own path: `_values` broadcasts, `_gae` runs the run's estimator on it
    cfg = load_config(CONFIGS / "toy.yaml", ["trainer.gamma=1.0", "trainer.lam=1.0", "critic.value_positions=turn"])
    b = _batch((1.0, 0.0))
    stub = SimpleNamespace(cfg=cfg, _critic_out=lambda b, slot=None: raw_critic(b), _value_positions="turn")
    _, v, after = Learner._values(stub, b)  # type: ignore[arg-type]
    gae_stub = SimpleNamespace(
        cfg=cfg, adv_fn=get_advantage(cfg.advantage_estimator), adv_traits=advantage_traits(cfg.advantage_estimator)
    )
    adv, ret = Learner._gae(gae_stub, b, v, after)  # type: ignore[arg-type]
    raw_v = shifted_values(raw_critic(b))
    for row, reward in enumerate((1.0, 0.0)):
        for tok, start in ((2, 2), (3, 2), (5, 5), (6, 5)):
            assert adv[row, tok].item() == pytest.approx(reward - raw_v[row, start].item())
        assert ret[row, 2].item() == pytest.approx(reward)


def test_a_value_range_clamps_what_the_advantages_read_so_no_failed_turn_is_credited_up() -> None:
    # an unbounded head valued states below the worst return and above the best (RL records: -0.21 .. 1.32); with
    # lambda 1 a failed turn from a state valued -0.3 got +0.3. Clamped to [0, 1]: failed <= 0, solved >= 0.
    sets = ["trainer.gamma=1.0", "trainer.lam=1.0", "critic.value_positions=turn", "critic.value_range=[0, 1]"]
    cfg = load_config(CONFIGS / "toy.yaml", sets)
    b = _batch((1.0, 0.0))
    out = torch.tensor([[-0.3, -0.3, -0.3, -0.3, 1.4, 0.2, 0.2, 0.9, 0.9]]).expand(b.shape).clone()
    stub = SimpleNamespace(cfg=cfg, _critic_out=lambda b, slot=None: out, _value_positions="turn")
    _, v, after = Learner._values(stub, b)  # type: ignore[arg-type]
    gae_stub = SimpleNamespace(
        cfg=cfg, adv_fn=get_advantage(cfg.advantage_estimator), adv_traits=advantage_traits(cfg.advantage_estimator)
    )
    adv, _ = Learner._gae(gae_stub, b, v, after)  # type: ignore[arg-type]
    for row, reward in enumerate((1.0, 0.0)):
        for tok, start_value in ((2, 0.0), (3, 0.0), (5, 1.0), (6, 1.0)):  # -0.3 -> 0, 1.4 -> 1
            assert adv[row, tok].item() == pytest.approx(reward - start_value)
    assert (adv[1][b.action_mask[1]] <= 0).all() and (adv[0][b.action_mask[0]] >= 0).all()
    assert v[~b.response_mask].eq(0).all()  # the prompt's zeros are not clamped into the range
    plain = load_config(CONFIGS / "toy.yaml", sets[:3])
    unclamped = SimpleNamespace(cfg=plain, _critic_out=stub._critic_out, _value_positions="turn")
    assert Learner._values(unclamped, b)[1][1, 2].item() == pytest.approx(-0.3)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["[1, 0]", "[0]", "[0, .inf]"])
def test_a_value_range_that_is_not_low_high_names_the_field_and_the_fix(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"critic.value_range: .* not \[low, high\].*\[0, 1\] for 0/1 rewards"):
        load_config(CONFIGS / "toy.yaml", [f"critic.value_range={bad}"])


def test_the_learner_trains_the_critic_at_turn_positions_only() -> None:
    cfg = load_config(CONFIGS / "toy.yaml", ["critic.value_positions=turn"])
    b = _batch()
    stub = SimpleNamespace(cfg=cfg, adv_traits=advantage_traits(cfg.advantage_estimator))
    (mask,) = Learner._value_masks(stub, [b])  # type: ignore[arg-type]
    assert mask.equal(value_mask(b, "turn"))


def test_an_unknown_value_position_names_the_field_and_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"critic.value_positions: unknown 'tokens'; use token or turn"):
        load_config(CONFIGS / "toy.yaml", ["critic.value_positions=tokens"])


class _FeatureCritic(torch.nn.Module):
    """A critic with random features and a linear head, as ``fit_head`` reads one."""

    def __init__(self, hidden: int = 4) -> None:
        super().__init__()
        self.value_head = torch.nn.Linear(hidden, 1)

    def features(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor | None = None) -> torch.Tensor:
        g = torch.Generator().manual_seed(int(ids.sum()))
        return torch.randn(*ids.shape, self.value_head.in_features, generator=g)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor | None = None) -> torch.Tensor:
        return self.value_head(self.features(ids, mask, pos)).squeeze(-1)


@pytest.mark.parametrize("positions", ["token", "turn"])
def test_the_head_fit_reads_the_positions_the_critic_trains(positions: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(CONFIGS / "toy.yaml", [f"critic.value_positions={positions}"])
    trajs = [Trajectory(f"t{i}", "e", SEGS, float(i % 2), "ok") for i in range(8)]
    rows: list[int] = []
    add = value_pretrain.HeadStats.add
    monkeypatch.setattr(value_pretrain.HeadStats, "add", lambda s, f, x, y: (rows.append(x.shape[0]), add(s, f, x, y)))
    value_pretrain.fit_head(_FeatureCritic(), trajs, cfg, 0)  # type: ignore[arg-type]
    assert rows == [int(value_mask(collate([t], 0), positions).sum()) for t in trajs]
    assert rows[0] == (4 if positions == "turn" else 6)


def test_the_probe_reads_each_action_token_at_its_turn_start() -> None:
    trajs = [Trajectory("a", "e", SEGS, 1.0, "ok"), Trajectory("b", "e", SEGS, 0.0, "ok")]

    class Position(torch.nn.Module):
        def forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor | None = None) -> torch.Tensor:
            return torch.arange(ids.shape[1], dtype=torch.float32).expand(ids.shape[0], -1).clone()

    v0_tok, ev_tok = first_action_values(Position(), trajs, 0, positions="token")
    v0_turn, ev_turn = first_action_values(Position(), trajs, 0, positions="turn")
    assert v0_tok == v0_turn == [1.0, 1.0]  # the first action is a turn start: the same state either way
    assert ev_tok != ev_turn  # the other action tokens are read at their turn's start under `turn`
