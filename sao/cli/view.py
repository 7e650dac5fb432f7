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
        run_dirs: list[Path] = typer.Argument(
            ...,
            help="run folder(s): sao train (staged or not), sao eval / sao collect --out, sao serve --gateway --out; "
            "two or more: side by side",
        ),
        port: int = typer.Option(0, help="port (0: a free one)"),
        host: str = typer.Option("127.0.0.1", help="address to listen on (the page has no login: keep it local)"),
        tokenizer: str = typer.Option("", help="tokenizer dir or alias for the token text (default: the run's model)"),
    ) -> None:
        """Serve a page of the run on HOST:PORT and print its URL; it reads the files as they grow. Ctrl-C stops."""
        from sao.eval.view.server import serve

        for d in run_dirs:
            if not d.is_dir():
                raise typer.BadParameter(f"{d} is not a folder: pass a run folder (sao train / eval --out)")
        port = port or _free_port(host)
        typer.echo(f"sao view: http://{host}:{port}/  ({', '.join(map(str, run_dirs))}; Ctrl-C stops)")
        serve(run_dirs, host, port, tokenizer or None)
