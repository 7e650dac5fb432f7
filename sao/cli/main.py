"""Entry point of the ``sao`` console script: wires the subcommand groups, imports nothing heavy."""

from __future__ import annotations

import signal
from types import FrameType

import typer

from sao.cli import bench, collect, envs_cmd, eval_cmd, export, serve, sft, tasks, train, view

app = typer.Typer(
    name="sao",
    help="SAO: train and evaluate LLM coding agents with Single-rollout Asynchronous Optimization.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
train.register(app)
sft.register(app)
collect.register(app)
app.add_typer(eval_cmd.app, name="eval", help="Evaluate a model: SWE-bench Verified, math benchmarks.")
app.add_typer(envs_cmd.app, name="envs", help="List and check the registered environments.")
app.add_typer(tasks.app, name="tasks", help="Build offline SWE-bench-format tasks from PyPI sdists.")
app.add_typer(bench.app, name="bench", help="Performance and learning benchmarks (docs/benchmarks.md).")
app.add_typer(export.app, name="export", help="Export a run's trajectories: ATIF, token ids and logprobs included.")
serve.register(app)
view.register(app)


EXIT_SIGTERM = 128 + signal.SIGTERM


def main() -> None:
    """The ``sao`` console script: the CLI with SIGTERM made a clean stop that exits 143. SIGTERM takes the path of
    Ctrl-C, whatever handles SIGINT at that moment (inside ``asyncio.run``: cancel the main task; elsewhere: raise
    ``KeyboardInterrupt``), so every ``finally`` and ``async with`` runs and removes the command's containers and
    servers before the process exits. Commands that stop in their own way (``sao train``: a checkpoint first)
    install their own handler while they run."""
    terminated: list[int] = []

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        terminated.append(signum)
        handler = signal.getsignal(signal.SIGINT)
        if not callable(handler):  # SIGINT ignored (a background job): still stop cleanly
            raise KeyboardInterrupt
        handler(signum, frame)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        app()
    except SystemExit as e:
        if terminated:
            raise SystemExit(EXIT_SIGTERM) from e
        raise


if __name__ == "__main__":
    main()
