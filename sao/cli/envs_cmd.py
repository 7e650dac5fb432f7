"""`sao envs` subcommands; each body imports its implementation lazily."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from rich.console import Console

app = typer.Typer(no_args_is_help=True)


def _warn_plugin_errors(console: Console) -> None:
    from sao.envs.registration import PLUGIN_GROUP, plugin_errors

    for err in plugin_errors():
        console.print(f"[yellow]warning[/yellow]: a {PLUGIN_GROUP} entry point failed to load: {err}")


@app.command("list")
def list_cmd() -> None:
    """Print the registered environment ids (built-in and from installed packages' `sao.envs` entry points)."""
    from rich.console import Console
    from rich.table import Table

    from sao.envs.registration import PLUGIN_GROUP, env_origin, list_envs

    table = Table("id", "from", "description")
    for env_id, desc in list_envs():
        table.add_row(env_id, env_origin(env_id), desc)
    console = Console()
    console.print(table)
    console.print(f"Envs of your own package: a {PLUGIN_GROUP!r} entry point (see docs/register_env.md).")
    _warn_plugin_errors(console)


@app.command("check")
def check_cmd(
    ids: list[str] = typer.Argument(
        None, help="Env ids to check, or module:sao/Name-v0 (default: every env `sao envs list` shows)."
    ),
    kwargs: str = typer.Option("", "--kwargs", help="Constructor kwargs as JSON, e.g. '{\"turns\": 2}'."),
) -> None:
    """Run gymnasium's check_env on the registered environments; exit 1 if any fails."""
    import json

    from rich.console import Console

    from sao.envs.checking import check_envs

    try:
        env_kwargs = json.loads(kwargs) if kwargs.strip() else None
    except json.JSONDecodeError as e:
        raise typer.BadParameter(f"--kwargs is not JSON ({e}); write it like '{{\"turns\": 2}}'") from e
    if env_kwargs is not None and not isinstance(env_kwargs, dict):
        raise typer.BadParameter(f"--kwargs must be a JSON object, got {kwargs!r}")
    console = Console()
    results = check_envs(ids or None, env_kwargs)
    for r in results:
        color = {"ok": "green", "failed": "red", "skipped": "yellow"}[r.status]
        console.print(f"[{color}]{r.status:8}[/{color}] {r.env_id}  ({r.seconds:.1f} s)  {r.message}")
    _warn_plugin_errors(console)
    if any(r.status == "failed" for r in results):
        raise typer.Exit(1)
