"""`sao serve`: launch a local inference server for a checkpoint; the body imports the engine lazily."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the serve command to the top-level app."""
