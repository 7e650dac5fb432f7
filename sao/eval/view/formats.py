"""The files `sao view` reads, by name, and the one record it is the first reader of: ``TokenRecord``.

The trainer writes ``token_records.jsonl`` (``trainer.token_records``); the record's type lives here, in the lower
layer, so the writer (``sao.trainer.learn.token_records``) and the reader (``sao.eval.view.reader``) share it.
"""

from __future__ import annotations

from typing import TypedDict

TRAJECTORIES = "trajectories.jsonl"
"""Episodes: plain trajectory lines (eval, collect, gateway) or a training run's ledger (``type`` lines)."""
METRICS = "metrics.jsonl"
TOKEN_RECORDS = "token_records.jsonl"
CRITIC_WARMUP = "critic_warmup.jsonl"
STAGE_DONE = "done.json"
SUMMARY = "summary.json"
REPORT = "report.json"

MASK_KEPT, MASK_LOW, MASK_HIGH, MASK_NONFINITE = "k", "l", "h", "x"
"""``TokenRecord.mask``, one character per action token: kept, masked below the band, above it, not finite."""


class TurnShape(TypedDict):
    """One segment of the episode: its kind (prompt / action / observation), tokens and sampling version."""

    kind: str
    tokens: int
    version: int | None


class TokenRecord(TypedDict):
    """What one training step did to one episode (one line of ``token_records.jsonl``). Lists run over the
    episode's action tokens in order; a value JSON cannot hold (NaN, inf) is null.

    ``version``: the policy version the step trained (the weights before it); ``policy_step``: whether the step
    updated the policy on this batch (False: a skipped or critic-only step; ``new_logp``, ``ratio`` and ``mask`` are
    then null); ``band``: the ratio bounds (lower, upper) the loss masks (DIS) or clips (PPO) by; ``value``: the
    critic's value at the token (null without a critic)."""

    step: int
    uid: str | None
    task_id: str
    row: int
    version: int
    policy_step: bool
    loss: str
    band: list[float]
    turns: list[TurnShape]
    engine_logp: list[float | None]
    new_logp: list[float | None] | None
    ratio: list[float | None] | None
    mask: str | None
    advantage: list[float | None]
    value: list[float | None] | None
