"""Entry point of the ``sao`` console script: wires the subcommand groups, imports nothing heavy."""

from __future__ import annotations

import typer

from sao.cli import bench, collect, envs_cmd, eval_cmd, export, serve, sft, tasks, train

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
app.add_typer(bench.app, name="bench", help="Benchmarks: algos, sandbox, engine, throughput, learning.")
app.add_typer(export.app, name="export", help="Export a run's trajectories: ATIF, token ids and logprobs included.")
serve.register(app)

if __name__ == "__main__":
    app()
