"""Per-token records of what a training step did to a sample of its episodes (``trainer.token_records``).

The learner already holds, per action token, everything an update used: the engine's logprob, the current policy's
logprob (the first policy epoch's forward), the DIS ratio and band, the advantage and the critic's value. A
``TokenProbe`` picks a few rows of rank 0's micro batches before the step, keeps the new logprobs of those rows as the
policy step computes them (no extra forward), and turns them into ``RowTokens`` after it; the run writes them with
the step and the episode's ledger uid to ``RUN_DIR/token_records.jsonl`` (``sao.eval.view.formats.TokenRecord``),
which `sao view` overlays on the episode's tokens.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sao.agent.records import Trajectory
from sao.core.jsonl import append_jsonl, iter_jsonl, write_text_durably
from sao.eval.view.formats import MASK_HIGH, MASK_KEPT, MASK_LOW, MASK_NONFINITE, TokenRecord, TurnShape
from sao.trainer.algos.losses import dis_band_masks
from sao.trainer.learn.batch import Batch

DIGITS = 4
"""Decimals kept per number: logprobs and ratios to 1e-4 (the engine's own logprobs agree with a recompute to ~1e-5)."""


@dataclass(frozen=True)
class RowTokens:
    """One recorded row: its row in the global batch and per action token the numbers the step used."""

    row: int
    policy_step: bool
    band: tuple[float, float]
    engine_logp: list[float | None]
    new_logp: list[float | None] | None
    ratio: list[float | None] | None
    mask: str | None
    advantage: list[float | None]
    value: list[float | None] | None


@dataclass
class TokenProbe:
    """One step's capture. ``picks``: ``(micro batch, row in it, row of the global batch)`` of the recorded rows."""

    picks: list[tuple[int, int, int]]
    new_logp: dict[int, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def sample(cls, micro_rows: list[list[int]], n: int, rng: random.Random) -> TokenProbe | None:
        """``n`` rows drawn (seeded, without replacement) from this rank's micro batches; None when ``n`` is 0."""
        every = [(i, j, row) for i, rows in enumerate(micro_rows) for j, row in enumerate(rows)]
        if n <= 0 or not every:
            return None
        return cls(sorted(rng.sample(every, min(n, len(every)))))

    def saw(self, micro_index: int, logp: torch.Tensor) -> None:
        """The policy's logprobs ``[b, T]`` of micro batch ``micro_index`` as the loss saw them (the first epoch only:
        later calls for the same micro batch are ignored)."""
        if micro_index not in self.new_logp and any(i == micro_index for i, _, _ in self.picks):
            self.new_logp[micro_index] = logp.detach().float().cpu()

    def rows(
        self,
        micro: list[Batch],
        advantages: list[torch.Tensor],
        values: list[torch.Tensor],
        band: tuple[float, float],
    ) -> list[RowTokens]:
        """The recorded rows after the step. ``band``: ``(eps_low, eps_high)`` of the loss's ratio bounds; ``values``
        empty without a critic. A row with no trainable action token (a non-finite reward) is left out."""
        out = []
        for i, j, row in self.picks:
            b = micro[i]
            pos = b.action_mask[j].nonzero().flatten().cpu()
            if pos.numel() == 0:
                continue
            engine = b.rollout_logprobs[j].float().cpu()[pos]
            new = self.new_logp[i][j][pos] if i in self.new_logp else None
            out.append(
                RowTokens(
                    row=row,
                    policy_step=new is not None,
                    band=(1.0 - band[0], 1.0 + band[1]),
                    engine_logp=_numbers(engine),
                    new_logp=None if new is None else _numbers(new),
                    ratio=None if new is None else _numbers(torch.exp(new - engine)),
                    mask=None if new is None else _mask(new - engine, band),
                    advantage=_numbers(advantages[i][j].float().cpu()[pos]),
                    value=_numbers(values[i][j].float().cpu()[pos]) if values else None,
                )
            )
        return out


def _numbers(t: torch.Tensor) -> list[float | None]:
    return [round(x, DIGITS) if math.isfinite(x) else None for x in t.tolist()]


def _mask(diff: torch.Tensor, band: tuple[float, float]) -> str:
    """One character per token: kept, below / above the band (``dis_band_masks``, the loss's own test), not finite."""
    finite = torch.isfinite(diff)
    low, high = dis_band_masks(torch.where(finite, diff, 0.0), finite, band[0], band[1])
    chars = []
    for ok, lo, hi in zip(finite.tolist(), low.tolist(), high.tolist(), strict=True):
        chars.append(MASK_NONFINITE if not ok else MASK_LOW if lo else MASK_HIGH if hi else MASK_KEPT)
    return "".join(chars)


def token_record(step: int, version: int, loss: str, uid: str | None, traj: Trajectory, r: RowTokens) -> TokenRecord:
    """The line written for ``r``: the step, the episode (``uid`` in the run's ledger), its turns, the numbers."""
    turns = [TurnShape(kind=s.kind, tokens=len(s.token_ids), version=s.policy_version) for s in traj.segments]
    return TokenRecord(
        step=step, uid=uid, task_id=traj.task_id, row=r.row, version=version, policy_step=r.policy_step, loss=loss,
        band=list(r.band), turns=turns, engine_logp=r.engine_logp, new_logp=r.new_logp, ratio=r.ratio, mask=r.mask,
        advantage=r.advantage, value=r.value,
    )  # fmt: skip


def write_token_records(path: Path, records: list[TokenRecord]) -> None:
    """Append one step's records (fsynced, ``sao.core.jsonl``); nothing when there are none."""
    if records:
        append_jsonl(path, records)


def drop_records_after(path: Path, step: int) -> None:
    """On resume from the checkpoint of ``step``: drop the records of later steps (a lost branch's, as the run's
    metrics drop theirs), rewriting the file atomically; a torn last line goes too."""
    if not path.exists():
        return
    keep = [r for _, r in iter_jsonl(path, torn_tail_ok=True) if int(r.get("step", 0)) <= step]
    write_text_durably(path, "".join(json.dumps(r) + "\n" for r in keep))
