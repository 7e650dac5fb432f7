"""``sao eval math``: a math benchmark (AIME 24/25, IMO-AnswerBench, any file) -> avg@k, pass@k, per-problem CSV.

Each problem is played ``samples`` times (at most ``workers`` episodes at once, ``sao.agent.episodes.EpisodeRunner``),
with ``--tools python`` (``PythonToolEnv``: a sandboxed python tool, answer as ``\\boxed{}`` or via ``submit``) or
``--tools none`` (``PlainAnswerEnv``: one assistant message, its last ``\\boxed{}`` graded). Grading is math-verify
in both (``sao.envs.python_tool.grade_answer``). avg@k is the mean fraction of correct samples per problem; pass@k uses
the unbiased estimator ``1 - C(n-c, k) / C(n, k)``. A sample whose episode hit an infrastructure failure (sandbox,
engine) is counted apart and left out of ``n`` (never a wrong answer). Written to ``--out``: ``samples.jsonl``
and ``trajectories.jsonl`` (as each episode finishes, fsynced), ``problems.csv`` and ``report.json``.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sao.agent.records import Trajectory
from sao.core.jsonl import atomic_path
from sao.envs.base import MultiTurnEnv, Turn
from sao.eval.common import (
    EvalError,
    append_jsonl,
    opened_model,
    parse_model_spec,
    pass_at_k,
    write_json,
)

PLAIN_SYSTEM_PROMPT = "Solve the problem. Reason step by step, then write the final answer as \\boxed{...}."


@dataclass(frozen=True)
class MathEvalConfig:
    """Options of ``sao eval math`` (see ``sao eval math --help``)."""

    model: str
    dataset: str
    out: Path
    tools: str = "python"
    samples: int = 1
    limit: int | None = None
    workers: int = 8
    max_steps: int = 10
    tokenizer: str | None = None
    max_context_tokens: int | None = None  # None: what the model allows (sao.eval.common.build_model)
    max_action_tokens: int | None = None  # None: a quarter of the context (one long reasoning turn)
    temperature: float = 0.6
    top_p: float = 0.95

    def __post_init__(self) -> None:
        if self.tools not in ("python", "none"):
            raise EvalError(f"--tools must be python or none, got {self.tools!r}")
        for name in ("samples", "workers", "max_steps"):
            if getattr(self, name) < 1:
                raise EvalError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.limit is not None and self.limit < 1:
            raise EvalError(f"--limit must be >= 1, got {self.limit}")


class PlainAnswerEnv(MultiTurnEnv):
    """One turn, no tools: the problem in, one assistant message out, its last ``\\boxed{}`` graded."""

    def __init__(self) -> None:
        super().__init__(max_steps=1)
        self._task: dict[str, str] = {}

    def system_prompt(self) -> str:
        return PLAIN_SYSTEM_PROMPT

    async def start_episode(self, task: Any) -> tuple[str, dict[str, Any]]:
        self._task = {"id": str(task.get("id", "")), "answer": str(task["answer"]).strip()}
        return str(task.get("problem", task.get("prompt"))), {"task_id": self._task["id"]}

    async def take_turn(self, action: str) -> Turn:
        from sao.envs.python_tool import grade_answer, last_boxed

        prediction = (last_boxed(action) or "").strip()
        # A crash or timeout of math-verify raises GraderError: the sample becomes an infra error, never a 0.
        ok, parsed = grade_answer(self._task["answer"], prediction) if prediction else (False, {})
        report = {"gold": self._task["answer"], "prediction": prediction, "correct": ok, **parsed}
        return Turn("Answer recorded.", reward=float(ok), terminated=True, info={"report": report, "solved": ok})


def _env_factory(cfg: MathEvalConfig) -> Callable[[], Any]:
    if cfg.tools == "none":
        return PlainAnswerEnv
    from sao.agent.episodes import env_factory

    return env_factory("sao/PythonTool-v0", {"max_steps": cfg.max_steps})


def sample_row(task: dict[str, Any], k: int, traj: Trajectory) -> dict[str, Any]:
    """One sample's line in ``samples.jsonl`` (an infra error is never a wrong answer)."""
    report = traj.info.get("report") or {}
    infra = traj.info.get("infra_error") if traj.status == "infra_error" else None
    return {
        "id": task["id"],
        "sample": k,
        "answer": task["answer"],
        "prediction": report.get("prediction", ""),
        "correct": bool(report.get("correct")) and not infra,
        "infra_error": infra,
        "turns": traj.info.get("turns", 0),
        "truncation_reason": traj.info.get("truncation_reason"),
        "seconds": round(traj.timings.get("total_s", 0.0), 2),
    }


async def run_math(cfg: MathEvalConfig) -> dict[str, Any]:
    """Run the evaluation into ``cfg.out``; return the report (also in ``report.json``)."""
    from sao.envs.datasets import load_math_tasks

    spec = parse_model_spec(cfg.model)
    try:
        tasks = load_math_tasks(cfg.dataset, limit=cfg.limit)
    except (FileNotFoundError, ValueError) as e:
        raise EvalError(f"--dataset {cfg.dataset}: {e}") from e
    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    for name in ("samples.jsonl", "trajectories.jsonl"):
        (out / name).unlink(missing_ok=True)  # a fresh run: the samples must match this report
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    build = dict(tokenizer=cfg.tokenizer, max_context_tokens=cfg.max_context_tokens,
                 max_action_tokens=cfg.max_action_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                 turns_in_context=4)  # fmt: skip
    async with opened_model(spec, [t["id"] for t in tasks], **build) as model:
        from sao.agent.episodes import Episode, EpisodeRunner, RunnerConfig

        # Sample k of a problem is reset with seed k; every sample's task id is the problem's.
        plan = [(t, k) for t in tasks for k in range(cfg.samples)]
        episodes = [Episode(i, t, k, t["id"]) for i, (t, k) in enumerate(plan)]
        player = model.player(max_turns=cfg.max_steps + 1)
        runner = EpisodeRunner(
            _env_factory(cfg), player, RunnerConfig(cfg.workers), out_path=out / "trajectories.jsonl"
        )

        def finished_one(traj: Trajectory) -> None:
            task, k = plan[int(traj.info["episode"])]
            row = sample_row(task, k, traj)
            append_jsonl(out / "samples.jsonl", row)
            rows.append(row)

        await runner.run(episodes, on_trajectory=finished_one)
    report = summarize(tasks, rows, cfg.samples, model=spec.name, dataset=cfg.dataset, tools=cfg.tools)
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    report["config"] = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}
    write_problems_csv(out / "problems.csv", report["problems"])
    write_json(out / "report.json", report)
    return report


def summarize(
    tasks: list[dict[str, Any]], rows: list[dict[str, Any]], k: int, *, model: str, dataset: str, tools: str
) -> dict[str, Any]:
    """Per-problem counts and the benchmark's avg@k / pass@j (j = 1, 2, 4, ... and k)."""
    ks = sorted({j for j in (1, 2, 4, 8, 16, 32, 64, 128) if j <= k} | {k})
    problems = []
    for t in tasks:
        mine = sorted((r for r in rows if r["id"] == t["id"]), key=lambda r: r["sample"])
        valid = [r for r in mine if not r["infra_error"]]
        n, c = len(valid), sum(r["correct"] for r in valid)
        p: dict[str, Any] = {"id": t["id"], "answer": t["answer"], "n": n, "correct": c}
        p["infra_errors"] = len(mine) - n
        p["avg"] = c / n if n else None
        for j in ks:
            p[f"pass@{j}"] = pass_at_k(n, c, j) if n >= j else None
        p["predictions"] = [r["prediction"] for r in mine]
        problems.append(p)
    graded = [p for p in problems if p["n"]]
    report: dict[str, Any] = {
        "model": model,
        "dataset": dataset,
        "tools": tools,
        "problems_total": len(tasks),
        "problems_graded": len(graded),
        "samples_per_problem": k,
        "infra_errors": sum(p["infra_errors"] for p in problems),
        f"avg@{k}": sum(p["avg"] for p in graded) / len(graded) if graded else None,
    }
    for j in ks:
        vals = [p[f"pass@{j}"] for p in graded if p[f"pass@{j}"] is not None]
        report[f"pass@{j}"] = sum(vals) / len(vals) if vals else None
    report["accuracy"] = report[f"avg@{k}"]
    report["problems"] = problems
    return report


def write_problems_csv(path: Path, problems: list[dict[str, Any]]) -> None:
    cols = [c for c in problems[0] if c != "predictions"] + ["predictions"] if problems else []
    with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for p in problems:
            w.writerow({**p, "predictions": " | ".join(p["predictions"])})


def print_summary(report: dict[str, Any], max_rows: int = 40) -> None:
    """A per-problem table (first ``max_rows``) and the headline numbers."""
    from rich.console import Console
    from rich.table import Table

    k = report["samples_per_problem"]
    console = Console()
    table = Table(title=f"math eval: {report['model']} on {report['dataset']} (tools: {report['tools']})")
    for col in ("problem", "answer", f"correct/{k}", "predictions", "infra"):
        table.add_column(col)
    for p in report["problems"][:max_rows]:
        preds = ", ".join(x or "-" for x in p["predictions"])
        table.add_row(p["id"], p["answer"][:30], f"{p['correct']}/{p['n']}", preds[:50], str(p["infra_errors"] or ""))
    console.print(table)
    if len(report["problems"]) > max_rows:
        console.print(f"... {len(report['problems']) - max_rows} more problems in problems.csv")

    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    passes = ", ".join(f"{key} {fmt(v)}" for key, v in report.items() if key.startswith("pass@"))
    console.print(
        f"[bold]avg@{k} {fmt(report[f'avg@{k}'])}[/bold], {passes} over {report['problems_graded']}/"
        f"{report['problems_total']} problems; infra errors {report['infra_errors']}"
    )
