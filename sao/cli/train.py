"""`sao train`, `sao pretrain-value` and `sao plot`; bodies import the trainer lazily."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Annotated

import typer

from sao.core.console import say, third_party_to_log


def _fail(e: Exception) -> None:
    typer.echo(f"error: {e}", err=True)
    raise typer.Exit(2)


def train_cmd(
    config: Annotated[str | None, typer.Argument(help="YAML config, e.g. configs/quickstart.yaml")] = None,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted overrides: trainer.critic_updates_per_step=2 ...")
    ] = None,
    resume: Annotated[str | None, typer.Option("--resume", help="continue the run in this RUN_DIR")] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", help="show third-party output (bars, warnings) here, not only in the log")
    ] = False,
) -> None:
    """Train a policy with SAO (or a baseline) on live rollouts; writes RUN_DIR (metrics, plots, checkpoints).

    The console shows SAO's own progress and messages; third-party progress bars and warnings go to
    RUN_DIR/logs/third_party.log (--verbose shows them too)."""
    from sao.envs.registration import EnvSetupError
    from sao.trainer.config import ConfigError

    items = list(overrides or [])
    # `sao train --resume RUN_DIR key=value` : the first positional is then an override, not a file.
    if config is not None and "=" in config and not config.endswith((".yaml", ".yml")):
        items.insert(0, config)
        config = None
    log: Path | None = None
    try:
        if resume is not None and config is None:
            from sao.trainer.runs.run_folder import require_run

            require_run(resume)  # before the log folder is made: a wrong path must leave nothing behind
        log = _third_party_log(config, items, resume)
        fresh = log is not None and not log.parent.parent.exists()
        with contextlib.nullcontext() if verbose or log is None else third_party_to_log(log):
            if log is not None and not verbose and int(os.environ.get("RANK", "0") or 0) == 0:
                say(f"sao train: setting up (models, DeepSpeed, rollout engine); library output goes to {log}")
            from sao.trainer.runs.run import train

            run_dir = train(config, items, resume)
    except (ConfigError, EnvSetupError) as e:
        if log is not None and fresh and log.exists() and log.stat().st_size == 0:
            shutil.rmtree(log.parent.parent, ignore_errors=True)  # refused before any work: leave no run dir
        _fail(e)
        return
    except BaseException:
        if log is not None and not verbose:
            typer.echo(f"(third-party output and warnings of this run: {log})", err=True)
        raise
    typer.echo(f"run finished: {run_dir}")
    if log is not None and not verbose:
        typer.echo(f"third-party output and warnings: {log}", err=True)


def _third_party_log(config: str | None, items: list[str], resume: str | None) -> Path | None:
    """RUN_DIR/logs/third_party.log (third_party.rankN.log on other ranks); None without a config (an error)."""
    if resume is not None:
        run_dir = Path(resume)
    elif config is not None:
        from sao.trainer.config import load_config

        run_dir = Path(load_config(config, items).run.dir)
    else:
        return None
    rank = int(os.environ.get("RANK", "0") or 0)
    return run_dir / "logs" / ("third_party.log" if rank == 0 else f"third_party.rank{rank}.log")


def pretrain_value_cmd(
    config: Annotated[str, typer.Argument(help="the training config whose critic to pretrain")],
    rollouts: Annotated[
        str, typer.Option("--rollouts", help="JSONL of trajectories (e.g. RUN_DIR/trajectories.jsonl)")
    ],
    out: Annotated[str | None, typer.Option("--out", help="checkpoint dir (default RUN_DIR/value_init)")] = None,
    epochs: Annotated[int, typer.Option("--epochs", help="passes over the rollouts")] = 2,
    overrides: Annotated[list[str] | None, typer.Argument(help="dotted overrides")] = None,
) -> None:
    """Train only the critic on saved trajectories; use the result as critic.init.

    Third-party bars and warnings go to OUT/logs/third_party.log."""
    from sao.trainer.config import ConfigError, load_config

    try:
        dest = Path(out) if out else Path(load_config(config, list(overrides or [])).run.dir) / "value_init"
        with third_party_to_log(dest / "logs" / "third_party.log"):
            from sao.trainer.learn.value_pretrain import pretrain_value

            path = pretrain_value(config, rollouts, out, epochs, list(overrides or []))
    except ConfigError as e:
        _fail(e)
        return
    typer.echo(f"critic checkpoint: {path}  (set critic.init={path})")


def plot_cmd(
    run_dir: Annotated[str, typer.Argument(help="a RUN_DIR written by sao train")],
    out: Annotated[str | None, typer.Option("--out", help="PNG path (default RUN_DIR/plots/curves.png)")] = None,
) -> None:
    """Write the training curves of a run as a PNG."""
    from sao.trainer.runs.metrics import plot_run

    try:
        path = plot_run(run_dir, out)
    except (FileNotFoundError, ValueError) as e:
        _fail(e)
        return
    typer.echo(str(path))


def register(app: typer.Typer) -> None:
    """Add the training commands to the top-level app."""
    app.command("train")(train_cmd)
    app.command("pretrain-value")(pretrain_value_cmd)
    app.command("plot")(plot_cmd)
