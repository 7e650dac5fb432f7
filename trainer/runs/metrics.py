"""Per-step metrics: RUN_DIR/metrics.jsonl (fsynced) + TensorBoard (+ W&B when configured), and PNG plots."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from sao.core.jsonl import append_jsonl, iter_jsonl, write_text_durably

# The curves `sao plot` draws, in this order (missing keys are skipped).
PLOT_KEYS = (
    "reward_mean",
    "success_rate",
    "explained_variance",
    "value_loss",
    "pg_loss",
    "entropy",
    "actor_grad_norm",
    "critic_grad_norm",
    "mask_frac_low",
    "mask_frac_high",
    "ratio_mean",
    "logp_diff_abs_mean",
    "policy_lag_mean",
    "dropped_stale",
    "infra_errors",
    "trajectories_per_s",
    "trained_tokens_per_s",
    "trainer_idle_frac",
    "weight_sync_s",
    "skipped_steps",
    "rss_gib",
    "peak_rss_gib",
)


class MetricsWriter:
    """Append one JSON line per step; mirror scalars to TensorBoard / W&B."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, wandb_project: str | None = None) -> None:
        self.path = run_dir / "metrics.jsonl"
        self._tb: Any = None
        self._wandb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
            except ImportError:
                self._tb = None
        if wandb_project:
            try:
                import wandb

                self._wandb = wandb.init(project=wandb_project, dir=str(run_dir), resume="allow")
            except ImportError as e:
                raise RuntimeError(
                    f"run.wandb_project is set but wandb is not installed ({e}); pip install wandb"
                ) from e

    def truncate_after(self, step: int) -> None:
        """On resume: drop lines of steps after the checkpoint (a lost branch), so the step counter continues."""
        if not self.path.exists():
            return
        keep = [r for _, r in iter_jsonl(self.path, torn_tail_ok=True) if 1 <= (_step_of(r) or 0) <= step]
        write_text_durably(self.path, "".join(json.dumps(r) + "\n" for r in keep))

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        rec = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        append_jsonl(self.path, [rec])
        scalars = {k: v for k, v in rec.items() if isinstance(v, int | float) and v is not None and k != "step"}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _step_of(rec: Any) -> int | None:
    try:
        return int(rec["step"])
    except (ValueError, KeyError, TypeError):
        return None


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found; is {run_dir} a run directory written by `sao train`?")
    return [rec for _, rec in iter_jsonl(path, torn_tail_ok=True)]  # a kill may leave a torn last line


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw the training curves of a run into one PNG (default RUN_DIR/plots/curves.png)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    if not rows:
        raise ValueError(f"{run_dir}/metrics.jsonl has no steps yet; train at least one step first")
    keys = [k for k in PLOT_KEYS if any(isinstance(r.get(k), int | float) for r in rows)]
    cols = 4
    nrows = max(1, math.ceil(len(keys) / cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 2.8 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, keys, strict=False):
        pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), int | float)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 30 else None)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    fig.suptitle(str(Path(run_dir).name))
    fig.tight_layout()
    target = Path(out) if out else Path(run_dir) / "plots" / "curves.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=90)
    plt.close(fig)
    return target
