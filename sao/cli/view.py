"""`sao view RUN_DIR`: a local web page of a run's metrics, episodes and per-token records (docs/view.md)."""

from __future__ import annotations

from pathlib import Path

import typer


def _free_port(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def register(app: typer.Typer) -> None:
    """Add the view command to the top-level app."""

    @app.command("view")
    def view(
        run_dir: Path = typer.Argument(
            ..., help="a run folder: sao train (staged or not), sao eval / sao collect --out, sao serve --gateway --out"
        ),
        port: int = typer.Option(0, help="port (0: a free one)"),
        host: str = typer.Option("127.0.0.1", help="address to listen on (the page has no login: keep it local)"),
        tokenizer: str = typer.Option("", help="tokenizer dir or alias for the token text (default: the run's model)"),
    ) -> None:
        """Serve a page of the run on HOST:PORT and print its URL; it reads the files as they grow. Ctrl-C stops."""
        from sao.eval.view.server import serve

        if not run_dir.is_dir():
            raise typer.BadParameter(f"{run_dir} is not a folder: pass a run folder (sao train / eval --out)")
        port = port or _free_port(host)
        typer.echo(f"sao view: http://{host}:{port}/  ({run_dir}; Ctrl-C stops)", err=False)
        serve(run_dir, host, port, tokenizer or None)
