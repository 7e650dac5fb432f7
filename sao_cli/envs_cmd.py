"""`sao envs` subcommands; each body imports its implementation lazily."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True)


@app.command("list")
def list_cmd() -> None:
    """Print the registered environment ids and what each one is."""
    from rich.console import Console
    from rich.table import Table

    from envs import list_envs

    table = Table("id", "description")
    for env_id, desc in list_envs():
        table.add_row(env_id, desc)
    Console().print(table)


@app.command("check")
def check_cmd(
    ids: list[str] = typer.Argument(None, help="Env ids to check (default: every registered sao/ env)."),
) -> None:
    """Run gymnasium's check_env on the registered environments; exit 1 if any fails."""
    from rich.console import Console

    from envs.checking import check_envs

    console = Console()
    results = check_envs(ids or None)
    for r in results:
        color = {"ok": "green", "failed": "red", "skipped": "yellow"}[r.status]
        console.print(f"[{color}]{r.status:8}[/{color}] {r.env_id}  ({r.seconds:.1f} s)  {r.message}")
    if any(r.status == "failed" for r in results):
        raise typer.Exit(1)
