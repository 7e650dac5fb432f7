"""`sao eval` subcommands; each body imports its implementation lazily."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer

from sao.core.console import third_party_to_log

app = typer.Typer(no_args_is_help=True)
VERBOSE_HELP = "Show third-party output (bars, warnings) here, not only in OUT/logs/third_party.log."


def _quiet(out: Path, verbose: bool) -> contextlib.AbstractContextManager[Any]:
    """Third-party bars and warnings of an evaluation go to OUT/logs/third_party.log; our progress stays here."""
    return contextlib.nullcontext() if verbose else third_party_to_log(out / "logs" / "third_party.log")


MODEL_HELP = (
    "What plays the episodes: vllm:http://host:port[,http://...] (running vLLM servers), local:/ckpt or an alias "
    "such as smollm2 (we serve it with vLLM), hf:/ckpt (in-process transformers, tiny models), "
    "openai:MODEL@BASE_URL (any OpenAI-compatible chat endpoint; key from OPENAI_API_KEY), scripted:FILE.jsonl "
    "(test fixture replaying fixed messages)."
)
TOKENIZER_HELP = "Tokenizer dir for vllm:/local:/hf: (default: the model's)."
CONTEXT_HELP = (
    "Context length in tokens (default: what the model's config allows, max_position_embeddings or a server's "
    "max_model_len, at most 32768)."
)


AGENT_HELP = (
    "What drives the model: sao (SAO's own loop and tools) or mini-swe-agent (the real package: its agent and "
    "SWE-bench prompts, the model behind SAO's gateway, or an openai: endpoint called directly)."
)


@contextlib.contextmanager
def _errors_end_the_command() -> Iterator[None]:
    """What an evaluation refuses (EvalError, a bad value, a missing file) ends the command with one line and exit
    code 2, not a traceback."""
    try:
        yield
    except (ValueError, FileNotFoundError) as e:  # EvalError is a ValueError
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e


@app.command("swebench")
def swebench_cmd(
    model: str = typer.Option(None, "--model", help=MODEL_HELP),
    dataset: str = typer.Option(
        "SWE-bench/SWE-bench_Verified",
        "--dataset",
        help="A SWE-bench-format file (.jsonl/.json/.parquet, e.g. from `sao tasks build`), `offline` (the small "
        "cached offline task set) or a Hugging Face dataset name (needs the hub, or HF_HUB_OFFLINE=1 and a cache).",
    ),
    instances: list[str] = typer.Option([], "--instances", help="Instance ids to run (repeatable or comma-separated)."),
    workers: int = typer.Option(2, "--workers", help="Instances run at once."),
    out: Path = typer.Option(Path("eval-swebench"), "--out", help="Output folder; rerun with it to resume."),
    max_steps: int = typer.Option(50, "--max-steps", help="Env steps per episode (the repo is graded at the limit)."),
    grade_only: Path = typer.Option(
        None, "--grade-only", help="Grade this predictions file (.jsonl/.json) with the official harness; no agent."
    ),
    harness: bool = typer.Option(False, "--harness/--no-harness", help="Also grade with the official harness."),
    split: str = typer.Option("test", "--split", help="Split of a Hugging Face dataset."),
    tokenizer: str = typer.Option(None, "--tokenizer", help=TOKENIZER_HELP),
    max_context: int = typer.Option(None, "--max-context", help=CONTEXT_HELP),
    max_tokens: int = typer.Option(
        None, "--max-tokens", help="Tokens sampled per turn at most (default: 1/16 of the context)."
    ),
    temperature: float = typer.Option(0.0, "--temperature", help="Sampling temperature."),
    agent: str = typer.Option("sao", "--agent", help=AGENT_HELP),
    agent_config: str = typer.Option(
        "",
        "--agent-config",
        help="The agent's own config: for mini-swe-agent a config name (default "
        "swebench_backticks; swebench for function calls) or a YAML path.",
    ),
    verbose: bool = typer.Option(False, "--verbose", help=VERBOSE_HELP),
) -> None:
    """Evaluate on SWE-bench-format instances: predictions.jsonl, trajectories, resolved/total, report.json."""
    import asyncio

    from sao.eval.common import EvalError
    from sao.eval.swebench_eval import SWEEvalConfig, print_summary, run_swebench

    ids = tuple(i.strip() for v in instances for i in v.split(",") if i.strip())
    with _errors_end_the_command():
        if grade_only is not None:
            from sao.eval.swebench_eval import grade_only as run_grade_only

            report: dict[str, Any] = run_grade_only(grade_only, dataset, out, workers=workers, split=split)
        else:
            if not model:
                raise EvalError("--model is required (or --grade-only PREDICTIONS)")
            cfg = SWEEvalConfig(
                model=model, dataset=dataset, out=out, instances=ids, workers=workers, max_steps=max_steps,
                split=split, tokenizer=tokenizer, max_context_tokens=max_context, max_action_tokens=max_tokens,
                temperature=temperature, harness=harness, agent=agent, agent_config=agent_config,
            )  # fmt: skip
            with _quiet(out, verbose):
                report = asyncio.run(run_swebench(cfg))
    print_summary(report)
    typer.echo(f"report: {out / 'report.json'}")


@app.command("math")
def math_cmd(
    model: str = typer.Option(..., "--model", help=MODEL_HELP),
    dataset: str = typer.Option(
        "aime25",
        "--dataset",
        help="A shipped benchmark (aime25 | aime24 | imo_answerbench), a .jsonl/.json/.csv/.parquet file or a "
        "Hugging Face dataset id.",
    ),
    tools: str = typer.Option("python", "--tools", help="python: a sandboxed python tool; none: one plain answer."),
    samples: int = typer.Option(1, "--samples", help="Samples per problem (k of avg@k and pass@k)."),
    limit: int = typer.Option(None, "--limit", help="Only the first n problems."),
    out: Path = typer.Option(Path("eval-math"), "--out", help="Output folder (report.json, per-problem CSV)."),
    workers: int = typer.Option(8, "--workers", help="Episodes run at once."),
    max_steps: int = typer.Option(10, "--max-steps", help="Turns per episode with --tools python."),
    tokenizer: str = typer.Option(None, "--tokenizer", help=TOKENIZER_HELP),
    max_context: int = typer.Option(None, "--max-context", help=CONTEXT_HELP),
    max_tokens: int = typer.Option(
        None, "--max-tokens", help="Tokens sampled per turn at most (default: 1/4 of the context)."
    ),
    temperature: float = typer.Option(0.6, "--temperature", help="Sampling temperature."),
    top_p: float = typer.Option(0.95, "--top-p", help="Nucleus sampling."),
    verbose: bool = typer.Option(False, "--verbose", help=VERBOSE_HELP),
) -> None:
    """Evaluate on a math benchmark: avg@k and pass@k with math-verify grading, per-problem CSV, report.json."""
    import asyncio

    from sao.eval.math_eval import MathEvalConfig, print_summary, run_math

    with _errors_end_the_command():
        cfg = MathEvalConfig(
            model=model, dataset=dataset, out=out, tools=tools, samples=samples, limit=limit, workers=workers,
            max_steps=max_steps, tokenizer=tokenizer, max_context_tokens=max_context, max_action_tokens=max_tokens,
            temperature=temperature, top_p=top_p,
        )  # fmt: skip
        with _quiet(out, verbose):
            report = asyncio.run(run_math(cfg))
    print_summary(report)
    typer.echo(f"report: {out / 'report.json'}")
