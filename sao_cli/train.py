"""`sao train`, `sao pretrain-value` and `sao plot`; bodies import the trainer lazily."""

from __future__ import annotations

from typing import Annotated

import typer


def _fail(e: Exception) -> None:
    typer.echo(f"error: {e}", err=True)
    raise typer.Exit(2)


def train_cmd(
    config: Annotated[str | None, typer.Argument(help="YAML config, e.g. configs/quickstart.yaml")] = None,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted overrides: trainer.critic_updates_per_step=2 ...")
    ] = None,
    resume: Annotated[str | None, typer.Option("--resume", help="continue the run in this RUN_DIR")] = None,
) -> None:
    """Train a policy with SAO (or a baseline) on live rollouts; writes RUN_DIR (metrics, plots, checkpoints)."""
    from trainer.config import ConfigError

    items = list(overrides or [])
    # `sao train --resume RUN_DIR key=value` : the first positional is then an override, not a file.
    if config is not None and "=" in config and not config.endswith((".yaml", ".yml")):
        items.insert(0, config)
        config = None
    try:
        from trainer.run import train

        run_dir = train(config, items, resume)
    except ConfigError as e:
        _fail(e)
        return
    typer.echo(f"run finished: {run_dir}")


def pretrain_value_cmd(
    config: Annotated[str, typer.Argument(help="the training config whose critic to pretrain")],
    rollouts: Annotated[
        str, typer.Option("--rollouts", help="JSONL of trajectories (e.g. RUN_DIR/trajectories.jsonl)")
    ],
    out: Annotated[str | None, typer.Option("--out", help="checkpoint dir (default RUN_DIR/value_init)")] = None,
    epochs: Annotated[int, typer.Option("--epochs", help="passes over the rollouts")] = 2,
    overrides: Annotated[list[str] | None, typer.Argument(help="dotted overrides")] = None,
) -> None:
    """Train only the critic on saved trajectories; use the result as critic.init."""
    from trainer.config import ConfigError

    try:
        from trainer.value_pretrain import pretrain_value

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
    from trainer.metrics import plot_run

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
