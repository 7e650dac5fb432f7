"""Value pretraining: train only the critic on saved trajectories (returns from their recorded rewards).

Reads ``sao.agent.records`` JSONL, a run's (or ``sao collect``'s) ``trajectories.jsonl`` (its ``trajectory`` records),
or a parquet file written by ``sao.agent.records_arrow.write_parquet``; infra errors are skipped. The targets are
RL's critic targets at lambda = 1 (``sao.trainer.learn.targets.value_targets``, the run's estimator on zero values):
the discounted reward-to-go, and on an episode whose return is incomplete (a cut nothing graded) plus the discounted
value the critic gives the state after its last token, the one end-of-episode rule RL follows. Runs ``epochs``
passes of the value loss on DeepSpeed and writes a critic checkpoint that ``critic.init`` accepts. Before those
passes the value head is set by ridge regression on the critic's features (``pretrain_value.head_fit``, ``fit_head``).
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import torch

from sao.agent.records import Trajectory
from sao.core.console import ProgressLine, say
from sao.core.jsonl import iter_jsonl
from sao.trainer import distributed as dist_utils
from sao.trainer.algos.losses import explained_variance_from_sums, explained_variance_sums
from sao.trainer.algos.registry import AdvantageFn, advantage_traits, get_advantage
from sao.trainer.config import Config, ConfigError, load_config
from sao.trainer.learn.batch import Batch, collate, shard_batch, token_scale
from sao.trainer.learn.deepspeed_engine import grad_accum_steps, make_engine
from sao.trainer.learn.learner import critic_step
from sao.trainer.learn.models import ValueModel, shifted_values
from sao.trainer.learn.targets import critic_returns, value_after, value_mask, value_targets, values_as_read


def read_rollouts(path: str | Path) -> list[Trajectory]:
    """Trajectories from a JSONL file of Trajectory records, a run's trajectories.jsonl, or a ``.parquet`` file of
    trajectories; infra errors and trajectories without actions skipped."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"--rollouts {str(p)!r} not found; pass a JSONL of trajectories (e.g. RUN_DIR/trajectories.jsonl) "
            "or a parquet file written by sao.agent.records_arrow.write_parquet"
        )
    if p.suffix == ".parquet":
        from sao.agent.records_arrow import read_parquet

        try:
            return _trainable(p, read_parquet(p))
        except ValueError as e:
            raise ConfigError(f"{p}: {e}") from e
    out = []
    for n, rec in iter_jsonl(p, error=ConfigError):
        if not isinstance(rec, dict):
            raise ConfigError(f"{p}:{n}: not a trajectory record (a JSON object was expected)")
        if rec.get("type") == "event" or rec.get("type") == "resume":
            continue
        body = rec.get("trajectory", rec)
        try:
            tr = Trajectory.from_dict(body)
        except (KeyError, ValueError, TypeError) as e:
            raise ConfigError(f"{p}:{n}: not a trajectory record ({e})") from e
        out.append(tr)
    return _trainable(p, out)


def _trainable(p: Path, trajs: list[Trajectory]) -> list[Trajectory]:
    out = [tr for tr in trajs if tr.status != "infra_error" and tr.action_segments]
    if not out:
        raise ConfigError(f"{p}: no trainable trajectories (all infra errors or no actions)")
    return out


def pretrain_value(
    config_path: str, rollouts: str, out_dir: str | None = None, epochs: int = 2, overrides: list[str] | None = None
) -> Path:
    """Train the critic of ``config_path`` on ``rollouts``; returns the checkpoint dir (default RUN_DIR/value_init)."""
    cfg = load_config(config_path, overrides)
    if epochs < 1:
        raise ConfigError("--epochs must be >= 1")
    trajs = read_rollouts(rollouts)
    out = Path(out_dir) if out_dir else Path(cfg.run.dir) / "value_init"
    fit_critic(cfg, trajs, [], epochs, cfg.critic.lr, out)
    return out


def split_by_task(trajs: list[Trajectory], holdout: float, seed: int) -> tuple[list[Trajectory], list[Trajectory]]:
    """(fit, held out): whole tasks go to one side, about ``holdout`` of them held out (at least one task each
    side when there are two or more tasks), so the held-out figure measures values on prompts the fit never saw."""
    tasks = sorted({tr.task_id for tr in trajs})
    random.Random(seed).shuffle(tasks)
    n_held = min(max(round(len(tasks) * holdout), 1), len(tasks) - 1) if len(tasks) > 1 else 0
    held_ids = set(tasks[:n_held])
    return [t for t in trajs if t.task_id not in held_ids], [t for t in trajs if t.task_id in held_ids]


def _estimator(cfg: Config) -> AdvantageFn:
    """The run's advantage estimator when it reads critic values (every critic algorithm's does), else
    skip-observation GAE."""
    name = cfg.advantage_estimator if advantage_traits(cfg.advantage_estimator).needs_values else "skip_obs_gae"
    return get_advantage(name)


@torch.no_grad()
def _returns(critic: Any, full: Batch, micro: list[Batch], cfg: Config, lam: float = 1.0) -> list[torch.Tensor]:
    """The value targets of ``micro`` (the shards of ``full``): RL's critic targets at ``lam`` (value pretraining's
    own: lambda = 1, ``value_targets`` on zero values). At lambda = 1 only a batch with a row that bootstraps costs a
    forward of ``critic`` (for the value after that row's last token); lambda < 1 reads the critic's own values
    (TD(lambda) targets, as RL's at ``trainer.critic_lam`` < 1). The choice is made on ``full``, which every rank
    holds, so ZeRO-3's collective forwards stay in step."""
    fn, bootstraps = _estimator(cfg), bool(full.bootstrap.any())
    out = []
    for b in micro:
        after, values = torch.zeros(b.shape[0]), torch.zeros_like(b.rewards)
        if bootstraps or lam < 1.0:
            raw = critic(b.input_ids, b.attention_mask, b.position_ids)
            after = value_after(raw, b, cfg.critic.value_range)
            if lam < 1.0:
                values = values_as_read(
                    shifted_values(raw).detach().float(), b, cfg.critic.value_positions, cfg.critic.value_range
                )
        out.append(critic_returns(b, value_targets(fn, b, values, after, cfg.trainer.gamma, lam), after))
    return out


def _batches(trajs: list[Trajectory], order: list[int], bs: int) -> list[list[Trajectory]]:
    # whole batches only (the accumulation count is fixed); fewer trajectories than a batch: one short batch
    return [[trajs[i] for i in order[s : s + bs]] for s in range(0, len(order) - bs + 1 if len(order) >= bs else 1, bs)]


@torch.no_grad()
def held_out_ev(critic: Any, held: list[Trajectory], cfg: Config, pad_id: int) -> float:
    """Explained variance of the critic's values against the returns on ``held`` (NaN when empty); collective."""
    if not held:
        return float("nan")
    parts = [0.0] * 5
    bs = cfg.trainer.batch_size
    for batch in (held[s : s + bs] for s in range(0, len(held), bs)):
        full = collate(batch, pad_id)
        micro = shard_batch(full, cfg.deepspeed)
        vals = [shifted_values(critic(b.input_ids, b.attention_mask, b.position_ids)) for b in micro]
        rets = _returns(critic, full, micro, cfg)
        for i, x in enumerate(
            explained_variance_sums(vals, rets, [value_mask(b, cfg.critic.value_positions) for b in micro])
        ):
            parts[i] += x
    return explained_variance_from_sums(dist_utils.all_reduce_sum(parts))


HEAD_FIT_FOLDS = 4
RIDGE_PENALTIES = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)
"""Ridge penalties tried for the head's least-squares fit, relative to the mean diagonal of the features' Gram
matrix (so the grid fits any hidden size and scale); the cross-validated best is kept."""


class HeadStats:
    """Least-squares sums of the value head's fit, per fold: ``gram`` = X'X and ``cross`` = X'y over the trained
    positions (``value_mask``) with a constant column for the bias, ``yy`` = y'y, ``n`` positions; float64."""

    def __init__(self, hidden: int, folds: int) -> None:
        d = hidden + 1
        self.gram = torch.zeros(folds, d, d, dtype=torch.float64)
        self.cross = torch.zeros(folds, d, dtype=torch.float64)
        self.yy = torch.zeros(folds, dtype=torch.float64)
        self.n = torch.zeros(folds, dtype=torch.float64)

    def add(self, fold: int, x: torch.Tensor, y: torch.Tensor) -> None:
        """Rows ``x`` ``[N, H]`` (the features a value is read from) with targets ``y`` ``[N]`` into ``fold``."""
        xb = torch.cat([x.double(), torch.ones(x.shape[0], 1, dtype=torch.float64)], dim=1)
        self.gram[fold] += xb.T @ xb
        self.cross[fold] += xb.T @ y.double()
        self.yy[fold] += (y.double() ** 2).sum()
        self.n[fold] += x.shape[0]


def _ridge_solve(gram: torch.Tensor, cross: torch.Tensor, penalty: float) -> torch.Tensor:
    d = gram.shape[0]
    reg = torch.eye(d, dtype=gram.dtype) * penalty
    reg[-1, -1] = 0.0  # the bias is not shrunk
    out: torch.Tensor = torch.linalg.solve(gram + reg, cross)
    return out


def ridge_head(stats: HeadStats, penalties: tuple[float, ...] = RIDGE_PENALTIES) -> dict[str, Any]:
    """The value head that least squares on the frozen features gives, its ridge penalty chosen by K-fold cross
    validation over episodes (each fold's error from the others' fit), then refitted on all the
    data. Returns ``weight`` ``[H]``, ``bias``, the chosen relative ``penalty``, and per-position squared errors:
    ``cv_mse`` (the chosen penalty's, out of fold) and ``mean_mse`` (a constant, each fold's mean from the others)."""
    gram, cross = stats.gram.sum(0), stats.cross.sum(0)
    folds = [k for k in range(stats.n.shape[0]) if stats.n[k] > 0]
    scale = float(torch.diagonal(gram)[:-1].mean())

    def out_of_fold(penalty: float, bias_only: bool) -> float:
        err = 0.0
        for k in folds:
            g, c = gram - stats.gram[k], cross - stats.cross[k]
            if bias_only:
                w = torch.zeros_like(c)
                w[-1] = c[-1] / max(float(g[-1, -1]), 1.0)
            else:
                w = _ridge_solve(g, c, penalty)
            err += float(stats.yy[k] - 2 * w @ stats.cross[k] + w @ stats.gram[k] @ w)
        return err / max(float(stats.n[folds].sum()), 1.0)

    if len(folds) < 2:
        raise ValueError("the head fit needs fit episodes in at least two folds; give value pretraining more rollouts")
    scores = {p: out_of_fold(p * scale, False) for p in penalties}
    best = min(scores, key=lambda p: scores[p])
    w = _ridge_solve(gram, cross, best * scale)
    return {"weight": w[:-1].float(), "bias": float(w[-1]), "penalty": best, "cv_mse": scores[best],
            "mean_mse": out_of_fold(0.0, True), "cv_mse_by_penalty": scores}  # fmt: skip


@torch.no_grad()
def fit_head(critic: ValueModel, fit: list[Trajectory], cfg: Config, pad_id: int) -> dict[str, Any]:
    """Set ``critic``'s value head (a plain module, before its engine is built) to the ridge fit of the
    Monte-Carlo targets on its backbone's features at the positions the critic loss trains (``ridge_head``; the
    folds are episodes in turn): a linear probe of the frozen features before any gradient step, so the fit's steps
    start from a head that already reads what those features hold, not from a random one that learns little more
    than the mean in a few dozen steps at a fine-tuning learning rate. Every rank reads all of ``fit``, one row at
    a time (the same head everywhere, no collective)."""
    stats = HeadStats(int(critic.value_head.in_features), HEAD_FIT_FOLDS)
    order = list(range(len(fit)))
    random.Random(cfg.run.seed).shuffle(order)
    was_training = critic.training
    critic.eval()
    dev = dist_utils.device()
    try:
        for i, j in enumerate(order):
            full = collate([fit[j]], pad_id)
            rows = [full.rows([r]).columns(n).to(dev) for r, n in enumerate(full.lengths)]
            for b, ret in zip(rows, _returns(critic, full, rows, cfg), strict=True):
                h = critic.features(b.input_ids, b.attention_mask, b.position_ids)
                feats = torch.zeros_like(h)
                feats[:, 1:] = h[:, :-1]  # the value of the state before token t is read at t - 1 (shifted_values)
                mk = value_mask(b, cfg.critic.value_positions)
                stats.add(i % HEAD_FIT_FOLDS, feats[mk].cpu(), ret[mk].cpu())
    finally:
        critic.train(was_training)
    res = ridge_head(stats)
    critic.value_head.weight.copy_(res.pop("weight")[None, :].to(critic.value_head.weight))
    critic.value_head.bias.fill_(res["bias"])
    return res


def _ev_text(ev: float) -> str:
    """An explained variance for a progress line; NaN means every return was equal (no variance to explain)."""
    return "n/a (every return equal)" if math.isnan(ev) else f"{ev:.3f}"


def _start_head(
    critic: ValueModel, fit: list[Trajectory], held: list[Trajectory], cfg: Config, pad_id: int
) -> dict[str, Any]:
    """``pretrain_value.head_fit: ridge``: ``fit_head`` and the held-out explained variance it reaches before any
    gradient step (empty under ``none``, or under 2 fit episodes: the penalty is chosen out of fold)."""
    if cfg.pretrain_value.head_fit != "ridge" or len(fit) < 2:
        return {}
    head = fit_head(critic, fit, cfg, pad_id)
    head["held_out_ev"] = held_out_ev(critic, held, cfg, pad_id)
    if dist_utils.rank() == 0:
        say(
            f"value head fit (ridge, penalty {head['penalty']:g}): out-of-fold squared error {head['cv_mse']:.4f} "
            f"vs {head['mean_mse']:.4f} for a constant (held out {_ev_text(head['held_out_ev'])})"
        )
    return head


def fit_critic(
    cfg: Config, fit: list[Trajectory], held: list[Trajectory], epochs: int, lr: float, out: Path, lam: float = 1.0
) -> dict[str, Any]:
    """Value pretraining proper: ``epochs`` passes over ``fit`` (batches of ``trainer.batch_size``, one critic
    optimizer step each, sharded and accumulated exactly as the learner does) and the critic written to ``out``
    (a dir ``critic.init`` accepts). Returns the fit's last loss / explained variance and the explained variance on
    ``held`` before and after: the figure that says whether the critic is warm. Collective over the ranks.
    ``lam``: the lambda of the fit's targets (1: Monte-Carlo returns, the stage's own; below 1: TD(lambda) targets
    on the critic's own values, as RL's at ``trainer.critic_lam``); the held-out figure is always against the
    Monte-Carlo returns, what a value should predict."""
    from sao.trainer.learn.models import load_actor, load_critic, load_tokenizer

    dist_utils.init_distributed()
    torch.manual_seed(cfg.run.seed)
    pad_id = int(load_tokenizer(cfg).pad_token_id)
    actor = load_actor(cfg)
    critic_model = load_critic(cfg, actor)
    del actor
    bs, mb = cfg.trainer.batch_size, cfg.deepspeed.micro_batch_size
    grad_accum = grad_accum_steps(bs, mb)
    critic_model.to(dist_utils.device())  # (the engine would move it; the head fit reads it before)
    ev_before = held_out_ev(critic_model, held, cfg, pad_id)
    head = _start_head(critic_model, fit, held, cfg, pad_id)
    critic = make_engine(critic_model, cfg, grad_accum, lr, cfg.critic.weight_decay, clip=cfg.critic.gradient_clipping)
    rng = random.Random(cfg.run.seed)
    loss, ev, steps = float("nan"), float("nan"), 0
    curve: list[dict[str, float]] = []
    per_epoch = max(len(fit) // bs, 1) if fit else 0
    line = ProgressLine("value fit", epochs * per_epoch, status="first step", enabled=dist_utils.rank() == 0)
    try:
        for epoch in range(epochs):
            norms: list[float] = []  # the critic's gradient norm before its clip, per step
            order = list(range(len(fit)))
            rng.shuffle(order)
            for batch in _batches(fit, order, bs):
                full = collate(batch, pad_id)
                micro = shard_batch(full, cfg.deepspeed)
                masks = [value_mask(b, cfg.critic.value_positions) for b in micro]
                rets = _returns(critic, full, micro, cfg, lam)
                n_total, scale = token_scale(masks, grad_accum)
                values: list[torch.Tensor] = []
                total, norm, _ = critic_step(critic, micro, masks, rets, None, None, scale, seen=values)
                norms.append(norm)
                loss = dist_utils.all_reduce_sum([total])[0] / max(n_total, 1.0)
                ev_sums = explained_variance_sums(values, rets, masks)
                ev = explained_variance_from_sums(dist_utils.all_reduce_sum(ev_sums))
                steps += 1
                line.update(steps, f"epoch {epoch + 1}/{epochs} loss {loss:.4f}")
            held_ev = held_out_ev(critic, held, cfg, pad_id)
            gn = sum(norms) / len(norms) if norms else float("nan")
            curve.append({"epoch": epoch + 1, "loss": loss, "fit_ev": ev, "held_out_ev": held_ev, "grad_norm": gn})
            if dist_utils.rank() == 0:
                say(
                    f"value pretraining epoch {epoch + 1}/{epochs}: loss {loss:.4f} explained variance {_ev_text(ev)} "
                    f"(held out {_ev_text(held_ev)})"
                )
    finally:
        line.close()
    sd = dist_utils.full_state_dict(critic.module, cfg.deepspeed.zero_stage)
    if sd is not None:
        critic.module.save(out, state=sd)
    dist_utils.barrier()
    return {
        "fit_trajectories": len(fit),
        "held_out_trajectories": len(held),
        "critic_steps": steps,
        "final_loss": loss,
        "fit_explained_variance": ev,
        "held_out_ev_before": ev_before,
        "held_out_ev_after": curve[-1]["held_out_ev"] if curve else float("nan"),
        "curve": curve,
        "head_fit": head or None,
    }
