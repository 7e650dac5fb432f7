"""The training progress line: step, ETA and the numbers a person watches (reward, success, lag), in 80 columns."""

from __future__ import annotations

from typing import Any

from sao.core.console import ProgressLine


class TrainProgress:
    """``train 12/80 [#---------] 1:02<5:21 reward 0.250 succ 0.25 lag 1.2``; the full metrics are in metrics.jsonl."""

    def __init__(self, total: int, done: int, enabled: bool, label: str = "train") -> None:
        first = "waiting for the first batch" if done == 0 else ""
        self._line = ProgressLine(label, total, done=done, status=first, enabled=enabled)

    def update(self, step: int, m: dict[str, Any]) -> None:
        status = f"reward {m['reward_mean']:.3f} succ {m['success_rate']:.2f} lag {m['policy_lag_mean']:.1f}"
        self._line.update(step, status)

    def close(self) -> None:
        self._line.close()
