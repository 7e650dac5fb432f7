"""`sao sft`: supervised fine-tuning on conversations or reward-filtered trajectories; the body imports lazily."""

from __future__ import annotations

from typing import Annotated

import typer


def sft_cmd(
    config: Annotated[str | None, typer.Argument(help="YAML config, e.g. configs/quickstart.yaml")] = None,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted overrides: sft.lr=1e-4 run.dir=runs/sft")
    ] = None,
    data: Annotated[
        list[str] | None,
        typer.Option("--data", help="JSONL / parquet / hub id of conversations or trajectories (repeatable)"),
    ] = None,
    min_reward: Annotated[
        float | None, typer.Option("--min-reward", help="trajectories: keep reward >= this (rejection sampling)")
    ] = None,
    resume: Annotated[str | None, typer.Option("--resume", help="continue the SFT run in this RUN_DIR")] = None,
) -> None:
    """Fine-tune the actor on demonstrations (loss on action tokens only); writes RUN_DIR/final/actor."""
    from sao.trainer.config import ConfigError
    from sao.trainer.sft.data import SFTDataError

    items = list(overrides or [])
    if config is not None and "=" in config and not config.endswith((".yaml", ".yml")):
        items.insert(0, config)
        config = None
    if data:
        items.append("sft.data=[" + ", ".join(repr(d) for d in data) + "]")
    if min_reward is not None:
        items.append(f"sft.min_reward={min_reward}")
    try:
        from sao.trainer.sft.run import sft

        run_dir, last = sft(config, items, resume)
    except (ConfigError, SFTDataError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    loss = last.get("sft_loss", float("nan"))
    typer.echo(f"sft finished: {run_dir}  (final loss {loss:.4f}; model: {run_dir}/final/actor)")


def register(app: typer.Typer) -> None:
    app.command("sft")(sft_cmd)
