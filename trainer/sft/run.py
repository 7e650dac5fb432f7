"""`sao sft`: supervised fine-tuning of the actor on demonstrations, on the same config tree, model loading,
DeepSpeed engine, checkpoints and metrics as `sao train`.

Loss: token-mean cross-entropy over action tokens only (prompt and observation tokens are masked), with token
ids from the agent's own renderer (``trainer/sft/data.py``). Batches hold ``sft.batch_size`` sequences of
similar length (bucketing), split into ``deepspeed.micro_batch_size`` micro batches, each padded only to its
own longest row. RUN_DIR gets ``config.yaml``, ``metrics.jsonl`` (+ TensorBoard), ``plots/curves.png``,
resumable checkpoints (``--resume RUN_DIR``) and ``final/actor`` (a HF model dir with the tokenizer).
"""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from sao.core.console import say
from sao.trainer import distributed as dist_utils
from sao.trainer.config import Config, ConfigError, config_diff, load_config, save_config
from sao.trainer.learn.deepspeed_engine import make_engine
from sao.trainer.runs.metrics import MetricsWriter, plot_run
from sao.trainer.runs.run_folder import (
    checkpoint_paths,
    commit_checkpoint,
    latest_checkpoint,
    latest_state,
    refuse_existing_run,
)
from sao.trainer.sft.data import Example, bucketed_batches, load_examples, padding_fraction


def _micro_tensors(rows: list[Example], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        n = len(r)
        ids[i, :n] = torch.tensor(r.input_ids)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(r.loss_mask)
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": mask}


def action_nll(model: Any, b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Summed negative log-likelihood of the loss-masked tokens, their count of correct argmax predictions,
    and how many there are (token t is predicted from tokens < t).

    The LM head runs only on the positions that predict a loss token: SFT data is mostly prompt and observation,
    and a ``[B, T, vocab]`` logits tensor would cost more time and memory than the rest of the step."""
    lm = getattr(model, "module", model)  # a DeepSpeed engine wraps the HF model
    backbone = getattr(lm, lm.base_model_prefix)
    hidden = backbone(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
    sel = b["loss_mask"][:, 1:]
    logits = lm.get_output_embeddings()(hidden[:, :-1][sel]).float()
    target = b["input_ids"][:, 1:][sel]
    nll = torch.nn.functional.cross_entropy(logits, target, reduction="sum")
    correct = (logits.argmax(-1) == target).sum()
    return nll, correct, int(sel.sum())


class SFTRun:
    """The SFT loop of one rank; ``run()`` trains to the end and returns the final metrics."""

    def __init__(self, cfg: Config, run_dir: Path, examples: list[Example], state: dict[str, Any] | None) -> None:
        from sao.trainer.learn.models import load_actor, load_tokenizer

        s = cfg.sft
        self.cfg, self.run_dir, self.examples = cfg, run_dir, examples
        world = dist_utils.world_size()
        if s.batch_size % world:
            raise ConfigError(f"sft.batch_size ({s.batch_size}) must be a multiple of the number of ranks ({world})")
        self.rank0 = dist_utils.rank() == 0
        self.tokenizer = load_tokenizer(cfg)
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.micro = cfg.deepspeed.micro_batch_size
        self.shard = s.batch_size // world
        self.grad_accum = math.ceil(self.shard / self.micro)
        torch.manual_seed(cfg.run.seed)
        actor = load_actor(cfg)
        self.engine = make_engine(actor, cfg, self.grad_accum, s.lr, s.weight_decay, s.warmup_steps)
        self.lengths = [len(e) for e in examples]
        per_epoch = math.ceil(len(examples) / s.batch_size)
        self.total_steps = s.steps if s.steps > 0 else per_epoch * s.epochs
        self.step = 0
        if state is not None:
            self.engine.load_checkpoint(state["_dir"], tag="actor")
            self.step = int(state["step"])

    def schedule(self) -> list[list[int]]:
        """Every step's batch (indices into the examples), the same on every rank and on resume."""
        out: list[list[int]] = []
        epoch = 0
        while len(out) < self.total_steps:
            out += bucketed_batches(self.lengths, self.cfg.sft.batch_size, seed=self.cfg.run.seed * 1000 + epoch)
            epoch += 1
        return out[: self.total_steps]

    def train_step(self, batch: list[int]) -> dict[str, float]:
        rank, world = dist_utils.rank(), dist_utils.world_size()
        mine = batch[rank::world]
        rows = [self.examples[i] for i in mine]
        micro = [rows[i : i + self.micro] for i in range(0, len(rows), self.micro)]
        n_total = max(1.0, dist_utils.all_reduce_sum([float(sum(sum(r.loss_mask[1:]) for r in rows))])[0])
        scale = self.grad_accum * world / n_total  # DeepSpeed averages over accumulation steps and ranks
        nll_sum = correct = 0.0
        dev = dist_utils.device()
        norm: float | None = None
        for mb in micro:
            b = {k: v.to(dev) for k, v in _micro_tensors(mb, self.pad_id).items()}
            nll, corr, _ = action_nll(self.engine, b)
            self.engine.backward(nll * scale)
            if mb is micro[-1] and self.cfg.deepspeed.zero_stage == 0:
                # DeepSpeed reports no norm with a plain torch optimizer.
                norm = float(sum(float(p.grad.float().pow(2).sum()) for p in self.engine.module.parameters()
                                 if p.grad is not None) ** 0.5)  # fmt: skip
            self.engine.step()  # the optimizer steps at the accumulation boundary
            nll_sum += float(nll.detach())
            correct += float(corr)
        nll_all, correct_all = dist_utils.all_reduce_sum([nll_sum, correct])
        gn = self.engine.get_global_grad_norm()
        return {
            "sft_loss": nll_all / n_total,
            "sft_token_accuracy": correct_all / n_total,
            "sft_action_tokens": n_total,
            "actor_grad_norm": float(gn) if gn is not None else float(norm if norm is not None else "nan"),
            "lr": float(self.engine.get_lr()[0]) if hasattr(self.engine, "get_lr") else float("nan"),
        }

    def save(self) -> None:
        """Collective: a resumable checkpoint (model + optimizer) written the run folder's durable way (a partial
        folder, fsynced, renamed; ``trainer.runs.run_folder``)."""
        ckpt, partial = checkpoint_paths(self.run_dir, self.step)
        dist_utils.barrier()  # every rank sees the emptied partial folder before writing into it
        self.engine.save_checkpoint(str(partial), tag="actor")
        dist_utils.barrier()  # every rank's partition is in before rank 0 renames the folder
        if self.rank0:
            try:
                commit_checkpoint(partial, ckpt, {"step": self.step}, self.cfg.run.keep_checkpoints)
            except OSError as e:
                shutil.rmtree(partial, ignore_errors=True)
                say(f"sft step {self.step}: checkpoint not written ({e}); the latest stays "
                    f"{latest_checkpoint(self.run_dir)}")  # fmt: skip
        dist_utils.barrier()

    def export(self, out: Path) -> None:
        """Collective: the trained actor as a HF model dir (with the tokenizer) on rank 0."""
        sd = dist_utils.full_state_dict(self.engine.module, self.cfg.deepspeed.zero_stage)
        if sd is not None:
            self.engine.module.save_pretrained(out, state_dict=sd, safe_serialization=True)
            self.tokenizer.save_pretrained(out)

    def run(self) -> dict[str, float]:
        metrics = (
            MetricsWriter(self.run_dir, self.cfg.run.tensorboard, self.cfg.run.wandb_project) if self.rank0 else None
        )
        if metrics is not None and self.step:
            metrics.truncate_after(self.step)
        batches = self.schedule()
        pad = padding_fraction(batches, self.lengths, self.micro)
        progress = _Progress(self.total_steps, self.step, self.cfg.run.progress and self.rank0)
        last: dict[str, float] = {}
        t_run = time.perf_counter()
        try:
            while self.step < self.total_steps:
                t0 = time.perf_counter()
                last = self.train_step(batches[self.step])
                self.step += 1
                last.update(step_s=time.perf_counter() - t0, padding_frac=pad)
                if metrics is not None:
                    metrics.write(self.step, last)
                progress.update(self.step, last)
                if self.step % self.cfg.run.save_every == 0 or self.step == self.total_steps:
                    self.save()
        finally:
            progress.close()
            if metrics is not None:
                metrics.close()
        self.export(self.run_dir / "final" / "actor")
        if self.rank0 and self.cfg.run.plot:
            plot_run(self.run_dir)
        last["wall_s"] = time.perf_counter() - t_run
        return last


class _Progress:
    """The SFT progress line: step, ETA, loss, token accuracy (``sao.core.console.ProgressLine``: 80 columns)."""

    def __init__(self, total: int, done: int, enabled: bool) -> None:
        from sao.core.console import ProgressLine

        self._line = ProgressLine("sft", total, done=done, status="first step", enabled=enabled)

    def update(self, step: int, m: dict[str, float]) -> None:
        self._line.update(step, f"loss {m['sft_loss']:.3f} token acc {m['sft_token_accuracy']:.2f}")

    def close(self) -> None:
        self._line.close()


def run_sft(cfg: Config, run_dir: Path, resume: bool = False) -> dict[str, float]:
    """SFT with ``cfg`` into ``run_dir`` (a new dir, or the same run's dir when ``resume``)."""
    if not cfg.sft.data:
        raise ConfigError("sft.data is empty; give files of conversations or trajectories (sft.data=[a.jsonl])")
    from sao.trainer.learn.models import load_tokenizer

    # The data is checked before anything heavy starts: a bad line fails in seconds.
    examples, stats = load_examples(
        list(cfg.sft.data), load_tokenizer(cfg), min_reward=cfg.sft.min_reward, max_len=cfg.sft.max_len
    )
    dist_utils.init_distributed()
    state = latest_state(run_dir) if resume else None
    if dist_utils.rank() == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / "config.yaml")
        say(
            f"sao sft: {stats.kept} examples from {stats.records} records ({stats.below_min_reward} below "
            f"min_reward, {stats.infra_errors} infra errors, {stats.too_long} too long)"
        )
    out = SFTRun(cfg, run_dir, examples, state).run()
    dist_utils.barrier()
    return out


def sft(
    config_path: str | None, overrides: list[str] | None = None, resume: str | None = None
) -> tuple[Path, dict[str, float]]:
    """`sao sft`: validate, then fine-tune. With ``resume`` the run's saved config is the base."""
    if config_path is None and resume is None:
        raise ConfigError("give a config file (sao sft configs/quickstart.yaml sft.data=[...]) or --resume RUN_DIR")
    if resume is not None:
        saved = Path(resume) / "config.yaml"
        if not saved.exists():
            raise ConfigError(f"--resume {resume!r}: no config.yaml there; pass a RUN_DIR written by `sao sft`")
        cfg = load_config(config_path or saved, overrides)
        diff = [k for k in config_diff(load_config(saved), cfg) if not k.startswith("sft.steps")]
        if diff and config_path is not None:
            raise ConfigError(f"--resume {resume!r}: the config differs from the run's saved config in {diff}")
        cfg.run.dir = resume
        run_dir = Path(resume)
    else:
        cfg = load_config(config_path, overrides)  # type: ignore[arg-type]
        run_dir = Path(cfg.run.dir)
        refuse_existing_run(run_dir, "sft")
    return run_dir, run_sft(cfg, run_dir, resume is not None)
