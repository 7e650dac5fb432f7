"""`sao tasks` subcommands; each body imports its implementation lazily."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True)


@app.command("build")
def build_cmd(
    sdist: list[str] = typer.Option(
        ..., "--sdist", help="A PyPI release with tests in its sdist, e.g. click==8.5.1 (repeat for several packages)."
    ),
    bugs: int = typer.Option(5, "--bugs", help="Validated bugs to make per sdist."),
    out: Path = typer.Option(Path("tasks.jsonl"), "--out", help="JSONL of SWE-bench-format instances (appended)."),
    max_candidates: int = typer.Option(200, "--max-candidates", help="Mutations to try per sdist at most."),
    workers: int = typer.Option(2, "--workers", help="Builder containers run in parallel."),
    seed: int = typer.Option(0, "--seed", help="Seed of the mutation order."),
    max_f2p: int = typer.Option(20, "--max-f2p", help="Drop bugs that break more tests than this."),
    test_dep: list[str] = typer.Option([], "--test-dep", help="Extra wheel the test suite needs (repeatable)."),
    verify: bool = typer.Option(True, "--verify/--no-verify", help="Grade each task's gold patch once (must resolve)."),
) -> None:
    """Build offline SWE-bench-format tasks: real sdist, its test suite, AST-injected bugs, images built offline."""
    import time

    from sao.core.setup import SetupError, ensure_base_image
    from sao.envs.swe.tasks import BuildConfig, build_tasks

    t0 = time.monotonic()
    try:  # the one command allowed to install: the Docker engine and the base image its tasks build on
        ensure_base_image()
    except SetupError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    try:
        cfg = BuildConfig(
            sdists=sdist,
            bugs=bugs,
            out=out,
            max_candidates=max_candidates,
            workers=workers,
            seed=seed,
            max_f2p=max_f2p,
            verify=verify,
            extra_test_deps=test_dep,
        )
        records = build_tasks(cfg)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    typer.echo(f"wrote {len(records)} task(s) to {out} in {time.monotonic() - t0:.0f} s")
    if len(records) < bugs * len(sdist):
        typer.echo(f"warning: asked for {bugs} per sdist; raise --max-candidates to find more", err=True)
