"""`sao export atif RUN`: every trajectories file of a run (training ledger, staged run's stages, `sao collect`,
`sao eval swebench`) as ATIF JSON lines (``sao.agent.atif_export``), token ids and logprobs per agent step.

Writes ``OUT/<the file's path under RUN, '/' as '__'>.atif.jsonl`` (default OUT: ``RUN/atif``), one ATIF
``Trajectory`` per line, each built by the ``atif`` package's models (so each is validated as written). The text of
the steps is decoded with the run's tokenizer: ``--tokenizer``, else the model of ``RUN/config.yaml`` (a training
or staged run), else that of ``summary.json`` / ``report.json`` (`sao collect`, `sao eval`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(no_args_is_help=True)
TRAJECTORY_FILES = "trajectories.jsonl"


def _model_of(run: Path) -> str | None:
    """The model a run played with, as its own files name it (config.yaml's model.path, else summary/report)."""
    cfg = run / "config.yaml"
    if cfg.is_file():
        from sao.core.config import load_yaml

        path = (load_yaml(cfg).get("model") or {}).get("path")
        if path:
            return str(path)
    for name in ("summary.json", "report.json"):
        f = run / name
        if f.is_file():
            model = json.loads(f.read_text()).get("model")
            if isinstance(model, str) and model:
                return model
    return None


def export_atif(run: Path, out: Path | None = None, tokenizer: str | None = None) -> dict[str, Any]:
    """Export every ``trajectories.jsonl`` under ``run``; the counts per file (``ValueError`` naming the fix)."""
    from sao.agent.atif_export import export_file
    from sao.agent.engines.registry import ModelSpecError, load_tokenizer

    if not run.is_dir():
        raise ValueError(f"RUN {str(run)!r} is not a folder; pass a run folder (sao train / collect / eval --out)")
    sources = sorted(p for p in run.rglob(TRAJECTORY_FILES) if p.is_file())
    if not sources:
        raise ValueError(f"no {TRAJECTORY_FILES} under {run}; is it a run folder?")
    model = _model_of(run)
    source = tokenizer or model
    if not source:
        raise ValueError(
            f"{run} does not name its model (no config.yaml, summary.json or report.json); pass --tokenizer"
        )
    try:
        tok = load_tokenizer(source)
    except ModelSpecError as e:
        raise ValueError(str(e)) from e
    dest_dir = out or run / "atif"
    files = {}
    for src in sources:
        rel = src.relative_to(run).as_posix().replace("/", "__").removesuffix(".jsonl")
        files[str(src)] = {"out": str(dest_dir / f"{rel}.atif.jsonl"), **export_file(
            src, dest_dir / f"{rel}.atif.jsonl", tok, model_name=model)}  # fmt: skip
    return files


def atif_cmd(
    run: Annotated[Path, typer.Argument(help="a run folder: sao train / sao collect --out / sao eval --out")],
    out: Annotated[Path | None, typer.Option("--out", help="output folder (default RUN/atif)")] = None,
    tokenizer: Annotated[
        str | None, typer.Option("--tokenizer", help="tokenizer dir or alias (default: the run's model)")
    ] = None,
) -> None:
    """Write a run's trajectories as ATIF (Agent Trajectory Interchange Format) JSON lines, with token ids and
    logprobs per agent step, for other viewers and tools."""
    try:
        files = export_atif(run, out, tokenizer)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    for src, c in files.items():
        typer.echo(f"{src}: {c['written']} trajectories ({c['skipped']} infra errors skipped) -> {c['out']}")


app.command("atif")(atif_cmd)
