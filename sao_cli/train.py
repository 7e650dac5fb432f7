"""`sao train`, `sao pretrain-value` and `sao plot`; bodies import the trainer lazily."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the training commands to the top-level app."""
