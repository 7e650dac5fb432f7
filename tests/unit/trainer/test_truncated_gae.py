"""The one rule for the end of an episode, through the trainer's own code: an episode whose return is complete
(terminated, a cut the env graded, an ending the policy caused) is terminal for GAE; only a cut nothing graded
bootstraps, from the critic's value of the state after the row's last token. Value pretraining and RL share it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from sao.agent.engines.scripted import ScriptedEngine
from sao.agent.loop import AgentConfig, run_episode
from sao.agent.records import Segment, Trajectory
from sao.envs.base import Grade, MultiTurnEnv, Turn
from sao.trainer.algos.advantages import gae, skip_observation_gae
from sao.trainer.algos.losses import value_loss
from sao.trainer.algos.reference import skip_observation_gae_loop
from sao.trainer.algos.registry import AdvantageInputs, advantage_traits, get_advantage
from sao.trainer.config import load_config
from sao.trainer.learn import value_pretrain
from sao.trainer.learn.batch import Batch, collate
from sao.trainer.learn.learner import Learner
from sao.trainer.learn.models import shifted_values
from sao.trainer.learn.targets import critic_mask, critic_returns, gae_inputs, value_after
from tests.unit.agent.agent_fakes import CharChatMLTokenizer

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
# prompt (2), action (2), observation (1), action (2): the row ends on its last action, token 6
ENDS_ON_ACTION = (
    Segment("prompt", (1, 2)),
    Segment("action", (3, 4), (-0.1, -0.2), 0, 0.0),
    Segment("observation", (5,)),
    Segment("action", (6, 7), (-0.1, -0.2), 0, None),
)
# ... then an observation after the last action (the agent's turn cap): the row ends on token 8
ENDS_ON_OBSERVATION = (*ENDS_ON_ACTION, Segment("observation", (8, 9)))
LAST_ACTION = 6
SKIP_OBS = advantage_traits("skip_obs_gae")


def cut(reward: float, graded: bool | None, reason: str = "step_limit", segs: Any = ENDS_ON_ACTION) -> Trajectory:
    info: dict[str, Any] = {"truncation_reason": reason}
    if graded is not None:
        info["graded"] = graded
    return Trajectory("t", "e", segs, reward, "truncated", info)


def raw_critic(b: Batch) -> torch.Tensor:
    """A critic's raw outputs, different at every position (so a bootstrap from the wrong token shows)."""
    return 0.3 + 0.05 * torch.arange(b.shape[1], dtype=torch.float32).expand(b.shape).clone()


def targets(trajs: list[Trajectory], gamma: float, lam: float = 1.0) -> tuple[Batch, torch.Tensor, torch.Tensor]:
    """(batch, advantages, returns) as the learner computes them (shifted values, the value after the row)."""
    b = collate(trajs, 0)
    raw = raw_critic(b)
    values = torch.where(b.response_mask, shifted_values(raw), 0.0)
    adv, ret = get_advantage("skip_obs_gae")(gae_inputs(b, values, value_after(raw, b), gamma, lam))
    return b, adv, ret


def test_a_graded_cut_that_solved_the_task_has_target_one_not_one_plus_v() -> None:
    b, _, ret = targets([cut(1.0, graded=True)], gamma=1.0)
    assert not bool(b.bootstrap[0])
    assert ret[0, LAST_ACTION].item() == pytest.approx(1.0)  # the bug: 1 + V, climbing with every update
    assert torch.allclose(ret[0][b.action_mask[0]], torch.ones(4))


def test_a_graded_cut_that_failed_has_target_zero_not_its_own_value() -> None:
    b, adv, ret = targets([cut(0.0, graded=True)], gamma=1.0)
    assert torch.all(ret[0][b.action_mask[0]] == 0.0)  # the bug: V at the cut, so the critic never learns it failed
    assert adv[0, LAST_ACTION].item() < 0.0


@pytest.mark.parametrize(("segs", "after_at"), [(ENDS_ON_ACTION, LAST_ACTION), (ENDS_ON_OBSERVATION, 8)])
def test_an_ungraded_cut_bootstraps_from_the_value_after_its_last_token(segs: Any, after_at: int) -> None:
    gamma = 0.9
    b, _, ret = targets([cut(0.5, graded=False, segs=segs)], gamma=gamma)
    raw = raw_critic(b)
    assert bool(b.bootstrap[0])
    # the critic's output at the row's last token: the state after the last action (and its observation)
    assert ret[0, LAST_ACTION].item() == pytest.approx(0.5 + gamma * raw[0, after_at].item())
    # not the value of the state before the last action token (the shifted value the old code used)
    assert ret[0, LAST_ACTION].item() != pytest.approx(0.5 + gamma * raw[0, LAST_ACTION - 1].item())


def test_a_format_error_ending_is_terminal_even_when_nothing_graded_it() -> None:
    t = cut(-0.5, graded=False, reason="format_errors")
    b, _, ret = targets([t], gamma=1.0)
    assert not t.bootstraps and not bool(b.bootstrap[0])
    assert ret[0, LAST_ACTION].item() == pytest.approx(-0.5)  # the penalty stands, not softened by V


def test_the_record_says_which_episodes_bootstrap_and_old_records_count_as_complete() -> None:
    ok = Trajectory("t", "e", ENDS_ON_ACTION, 1.0, "ok", {"graded": False})
    assert not ok.bootstraps  # terminated: complete, whatever else the info says
    assert not cut(0.0, graded=True).bootstraps and cut(0.0, graded=False).bootstraps
    assert not cut(0.0, graded=None).bootstraps  # written before `graded` existed: its return is taken as final
    again = Trajectory.from_json(cut(0.0, graded=False).to_json())
    assert again.bootstraps


class CutEnv(MultiTurnEnv):
    """One step allowed; ``on_truncation`` returns ``grade``; ``format_error`` makes every action unparseable."""

    def __init__(self, grade: Grade | None, format_error: bool = False) -> None:
        super().__init__(max_steps=1, max_format_errors=1)
        self.grade, self.format_error = grade, format_error

    async def start_episode(self, task: Any) -> tuple[str, dict[str, Any]]:
        return "go", {"task_id": "cut"}

    async def take_turn(self, action: str) -> Turn:
        return Turn(observation="obs", format_error=self.format_error)

    async def on_truncation(self, reason: str) -> Grade | None:
        return self.grade


async def episode(env: Any, cfg: AgentConfig | None = None) -> Trajectory:
    tok = CharChatMLTokenizer()
    engine = ScriptedEngine([[*tok.encode("a"), tok.eos_token_id]])
    return await run_episode(env, engine, tok, cfg or AgentConfig(), options={"task": {}})


async def test_the_env_and_the_loop_record_whether_a_cut_was_graded() -> None:
    graded = await episode(CutEnv(Grade(1.0, True, {"tests": "pass"})))
    assert graded.status == "truncated" and graded.info["graded"] is True and not graded.bootstraps
    assert graded.reward == 1.0
    ungraded = await episode(CutEnv(None))
    assert ungraded.info["graded"] is False and ungraded.bootstraps
    policy = await episode(CutEnv(None, format_error=True))
    assert policy.info["truncation_reason"] == "format_errors" and not policy.bootstraps


class NoGradeEnv:
    """An env without ``aend`` that never ends an episode by itself: the agent's turn cap ends it, ungraded."""

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, Any]:
        return "go", {"role": "user"}

    async def astep(self, action: str) -> tuple[str, float, bool, bool, Any]:
        return "obs", 0.0, False, False, {}


async def test_an_agent_limit_nothing_graded_bootstraps_and_one_the_env_graded_does_not() -> None:
    t = await episode(NoGradeEnv(), AgentConfig(max_turns=1))
    assert t.info["truncation_reason"] == "max_turns" and t.info["graded"] is False and t.bootstraps
    env = CutEnv(Grade(0.0, False))
    env.max_steps = 5
    t = await episode(env, AgentConfig(max_turns=1))  # the agent's cap, then the env grades through aend
    assert t.info["truncation_reason"] == "max_turns" and t.info["graded"] is True and not t.bootstraps


def test_value_pretraining_and_rl_give_the_critic_the_same_targets() -> None:
    cfg = load_config(CONFIGS / "toy.yaml", ["trainer.gamma=0.9", "trainer.lam=0.8", "trainer.critic_lam=1.0"])
    trajs = [cut(1.0, True), cut(0.0, True), cut(0.5, False), cut(0.5, False, segs=ENDS_ON_OBSERVATION),
             Trajectory("t", "e", ENDS_ON_ACTION, 1.0, "ok"), cut(-1.0, False, reason="format_errors")]  # fmt: skip
    b = collate(trajs, 0)
    critic = lambda ids, mask, pos: raw_critic(b)  # noqa: E731 - the critic's forward, as the engines are called
    (pretrain,) = value_pretrain._returns(critic, b, [b], cfg)
    stub = SimpleNamespace(cfg=cfg, adv_fn=get_advantage(cfg.advantage_estimator), adv_traits=SKIP_OBS)
    raw = raw_critic(b)
    values = torch.where(b.response_mask, shifted_values(raw), 0.0)
    _, rl = Learner._gae(stub, b, values, value_after(raw, b))  # type: ignore[arg-type]
    m = b.action_mask
    assert torch.allclose(pretrain[m], rl[m], atol=1e-6)
    assert pretrain[0, LAST_ACTION].item() == pytest.approx(1.0) and pretrain[1, LAST_ACTION].item() == 0.0


def test_a_value_fit_at_lambda_below_one_gives_the_targets_rl_gives_at_that_critic_lambda() -> None:
    # `sao bench value-fit --lams`: TD(lambda) targets on the critic's own values, the same as RL's critic_lam.
    cfg = load_config(CONFIGS / "toy.yaml", ["trainer.gamma=1.0", "trainer.lam=0.95", "trainer.critic_lam=0.5"])
    trajs = [cut(1.0, True), cut(0.0, True), cut(0.5, False), Trajectory("t", "e", ENDS_ON_ACTION, 1.0, "ok")]
    b = collate(trajs, 0)
    critic = lambda ids, mask, pos: raw_critic(b)  # noqa: E731
    (fit,) = value_pretrain._returns(critic, b, [b], cfg, lam=0.5)
    (mc,) = value_pretrain._returns(critic, b, [b], cfg)
    stub = SimpleNamespace(cfg=cfg, adv_fn=get_advantage(cfg.advantage_estimator), adv_traits=SKIP_OBS)
    raw = raw_critic(b)
    _, rl = Learner._gae(stub, b, torch.where(b.response_mask, shifted_values(raw), 0.0), value_after(raw, b))  # type: ignore[arg-type]
    m = b.action_mask
    assert torch.allclose(fit[m], rl[m], atol=1e-6)
    assert not torch.allclose(fit[m], mc[m])  # the critic's values entered the targets
    assert fit[0, LAST_ACTION].item() == pytest.approx(1.0)  # the graded cut's last token: its grade, no bootstrap


MASK = torch.tensor([[0, 1, 1, 0, 1, 1, 0]], dtype=torch.bool)
VALUES = torch.tensor([[0.0, 0.2, 0.3, 9.0, 0.5, 0.7, 9.0]])
REWARDS = torch.tensor([[0.0, 0.0, 0.1, 0.0, 0.0, 0.0, 0.0]])


def test_mixed_batch_matches_the_loop_on_the_sparse_and_dense_paths() -> None:
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(6, 40, generator=g)
    values = torch.rand(6, 40, generator=g)
    mask = torch.rand(6, 40, generator=g) > 0.4
    mask[2] = False  # a row without action tokens
    after = torch.rand(6, generator=g) * torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0])
    for gamma, lam in ((1.0, 1.0), (0.97, 0.9), (0.99, 1.0)):
        adv, ret = skip_observation_gae(rewards, values, mask, gamma, lam, bootstrap_values=after)
        ref_adv, ref_ret = skip_observation_gae_loop(rewards, values, mask, gamma, lam, after)
        assert torch.allclose(adv.double(), ref_adv, atol=1e-5), (gamma, lam)
        assert torch.allclose(ret.double(), ref_ret, atol=1e-5), (gamma, lam)


def test_token_gae_and_the_registry_entries_read_the_bootstrap_values() -> None:
    response = torch.tensor([[0, 1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    after = torch.tensor([0.4])
    adv, _ = gae(REWARDS, VALUES, response, 1.0, 1.0, bootstrap_values=after)
    assert adv[0, 5].item() == pytest.approx(0.4 - 0.7)  # r 0 + V(after) - V(last)
    for name in ("skip_obs_gae", "gae"):
        inputs = AdvantageInputs(REWARDS, MASK, VALUES, response_mask=response, bootstrap_values=after)
        a, _ = get_advantage(name)(inputs)
        assert a[0, 5].item() == pytest.approx(0.4 - 0.7), name


def test_a_wrongly_shaped_bootstrap_is_refused() -> None:
    with pytest.raises(ValueError, match="bootstrap_values must be"):
        skip_observation_gae(REWARDS, VALUES, MASK, 1.0, 1.0, bootstrap_values=torch.tensor([0.1, 0.2]))


def test_the_state_an_ungraded_cut_bootstraps_from_is_a_critic_target() -> None:
    # issue 44: value_after read the critic's output at the row's last token, and every critic loss trained only the
    # shifted values on action tokens (the output at the token before each action), so the output after an action
    # was never a target. Row 0 is cut after its first action; row 1 is the same turn with the episode going on.
    cut_early = Trajectory("t", "e", ENDS_ON_ACTION[:2], 0.0, "truncated", {"graded": False})
    longer = Trajectory("t", "e", ENDS_ON_ACTION, 1.0, "ok")
    b = collate([cut_early, longer], 0)
    raw = raw_critic(b).requires_grad_(True)
    after = value_after(raw, b)
    assert after[0] == raw[0, 3]  # the cut bootstraps from the output at its last action token (3)
    values = shifted_values(raw)
    adv_fn = get_advantage("skip_obs_gae")
    _, ret = adv_fn(gae_inputs(b, values.detach(), after.detach(), 1.0, 1.0))
    targets_ = critic_returns(b, ret, after.detach())
    mask = critic_mask(b)
    assert mask[1, 4] and targets_[1, 4] == ret[1, 5] == pytest.approx(1.0)  # after turn 1's action: turn 2's return
    loss, _ = value_loss(values, values.detach(), targets_, mask, None)
    loss.backward()
    assert raw.grad is not None and raw.grad[1, 3] != 0, "the output after an action is no critic target"


def test_value_pretraining_trains_the_state_after_each_action_as_rl_does() -> None:
    cfg = load_config(CONFIGS / "toy.yaml", ["trainer.gamma=1.0", "trainer.critic_lam=1.0"])
    trajs = [cut(0.5, False), cut(0.5, False, segs=ENDS_ON_OBSERVATION), Trajectory("t", "e", ENDS_ON_ACTION, 1.0)]
    b = collate(trajs, 0)
    critic = lambda ids, mask, pos: raw_critic(b)  # noqa: E731
    (pretrain,) = value_pretrain._returns(critic, b, [b], cfg)
    stub = SimpleNamespace(cfg=cfg, adv_fn=get_advantage(cfg.advantage_estimator), adv_traits=SKIP_OBS)
    raw = raw_critic(b)
    _, rl = Learner._gae(stub, b, torch.where(b.response_mask, shifted_values(raw), 0.0), value_after(raw, b))  # type: ignore[arg-type]
    m = critic_mask(b)
    assert m[:, 4].all() and torch.allclose(pretrain[m], rl[m], atol=1e-6)
    # after the first action (token 4): the return of the second turn; after the last action of the row that ends
    # on an observation (token 7, after action token 6): the value after the row, what it bootstraps from
    assert pretrain[2, 4].item() == pytest.approx(1.0) and pretrain[0, 4].item() == pytest.approx(pretrain[0, 5].item())
    assert m[1, LAST_ACTION + 1] and pretrain[1, LAST_ACTION + 1].item() == pytest.approx(value_after(raw, b)[1].item())
