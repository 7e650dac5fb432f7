"""``sao eval swebench``: run an agent on SWE-bench-format instances in ``SWEEnv``, write predictions, grade, report.

Per instance (at most ``workers`` at once, through ``sao.agent.episodes.EpisodeRunner``): a fresh ``SWEEnv`` episode;
when it ends the env has graded the repo's diff in a fresh container with the swebench grading functions (an
episode cut by the agent's own limits is graded by the env the same way, ``aend``). Written as each instance
finishes, flushed and fsynced, in ``--out``:
``predictions.jsonl`` (official format: ``instance_id``, ``model_name_or_path``, ``model_patch``),
``trajectories.jsonl`` and ``results.jsonl`` (our verdict per instance). A rerun with the same ``--out`` skips
instances that already have a prediction and a result (infra failures are retried). ``report.json`` and a table
sum up: resolved / total, with infrastructure failures (Docker, grader, engine) counted apart from unresolved.
``--harness`` also grades the predictions with the official ``swebench.harness.run_evaluation``
(``sao.eval.harness``); ``--grade-only`` does only that, on an existing predictions file.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sao.agent.harness.registry import describe_harness, harness_spec
from sao.agent.records import Trajectory
from sao.core.console import say
from sao.envs.datasets import HUB_PROBE_TIMEOUT_S, hub_available
from sao.eval.common import (
    EvalError,
    EvalModel,
    append_jsonl,
    opened_model,
    parse_model_spec,
    read_jsonl_records,
    write_json,
)
from sao.eval.harness import grade_with_harness, load_predictions
from sao.sandboxes.protocols import SandboxError

OFFLINE_ALIAS = "offline"
#: Default tokens per turn: this share of the context. A SWE episode is many short turns (a thought and one command
#: each), and a small model that never calls a tool must not spend minutes per turn before its format errors end it.
SWE_TURNS_IN_CONTEXT = 16
SWE_ENV = "sao/SWE-v0"


@dataclass(frozen=True)
class SWEEvalConfig:
    """Options of ``sao eval swebench`` (see ``sao eval swebench --help``)."""

    model: str
    dataset: str
    out: Path
    instances: tuple[str, ...] = ()
    workers: int = 2
    max_steps: int = 50
    split: str = "test"
    tokenizer: str | None = None
    max_context_tokens: int | None = None  # None: what the model allows (sao.eval.common.build_model)
    max_action_tokens: int | None = None  # None: 1/16 of the context (SWE_TURNS_IN_CONTEXT)
    temperature: float = 0.0
    grade_timeout_s: float = 1800.0
    harness: bool = False
    agent: str = "sao"
    """What plays the episodes (``sao.agent.harness.registry``): SAO's own loop, or ``mini_swe_agent``."""
    agent_config: str = ""
    """The agent's own config (mini-swe-agent: one of its config names or a YAML path); empty: its default."""

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise EvalError(f"--workers must be >= 1, got {self.workers}")
        if self.max_steps < 1:
            raise EvalError(f"--max-steps must be >= 1, got {self.max_steps}")
        try:
            harness_spec(self.agent).check_env(SWE_ENV)
        except ValueError as e:
            raise EvalError(f"--agent {self.agent}: {e}") from e


# ---- dataset ---------------------------------------------------------------------------------------------------
def load_swe_dataset(dataset: str, instances: tuple[str, ...] = (), split: str = "test") -> list[dict[str, Any]]:
    """Validated records of a local file, the cached offline task set (``offline``) or a Hugging Face dataset."""
    from sao.envs.swe.tasks.instance import load_instances, validate_instance

    path = Path(dataset).expanduser()
    if dataset == OFFLINE_ALIAS:
        from sao.envs.swe.tasks import ensure_offline_tasks

        try:
            records = ensure_offline_tasks()
        except SandboxError as e:  # no daemon or no base image: the message names the setup step
            raise EvalError(f"the offline tasks need Docker and the offline base image: {e}") from e
    elif path.exists() or path.suffix in (".json", ".jsonl", ".parquet"):
        if path.suffix == ".parquet" and path.exists():
            from datasets import load_dataset

            records = [validate_instance(dict(r)) for r in load_dataset("parquet", data_files=str(path), split="train")]
        else:
            records = load_instances(path)
    else:
        if not hub_available():
            raise EvalError(
                f"--dataset {dataset}: the Hugging Face Hub is not reachable from here (no answer in "
                f"{HUB_PROBE_TIMEOUT_S:g} s). Pass a local file instead (--dataset FILE.jsonl|.json|.parquet: export "
                "the dataset where the hub is reachable, or build offline tasks with `sao tasks build`, or use "
                f"--dataset {OFFLINE_ALIAS}), or set HF_HUB_OFFLINE=1 to read a copy already in the HF cache"
            )
        from datasets import load_dataset

        try:
            ds = load_dataset(dataset, split=split)
        except Exception as e:
            raise EvalError(
                f"--dataset {dataset}: could not load split {split!r} ({type(e).__name__}: {e}); "
                "pass a local FILE instead"
            ) from e
        records = [validate_instance(dict(r)) for r in ds]
    if instances:
        by_id = {r["instance_id"]: r for r in records}
        unknown = [i for i in instances if i not in by_id]
        if unknown:
            raise EvalError(f"--instances: {unknown} not in {dataset} (it has {len(records)} instances)")
        records = [by_id[i] for i in instances]
    if not records:
        raise EvalError(f"--dataset {dataset}: no instances")
    return records


# ---- one instance ----------------------------------------------------------------------------------------------
def _verdict(resolved: bool | None, infra: str | None) -> str:
    return "infra_error" if infra else ("resolved" if resolved else "unresolved")


def result_of(iid: str, traj: Trajectory) -> dict[str, Any]:
    """Our verdict on one finished episode (the env graded the repo when the episode ended, however it ended)."""
    infra = traj.info.get("infra_error") if traj.status == "infra_error" else None
    report = traj.info.get("report") or {}
    resolved = bool(report.get("resolved"))
    patch = report.get("model_patch", "")
    return {
        "instance_id": iid,
        "verdict": _verdict(resolved, infra),
        "resolved": resolved,
        "turns": traj.info.get("turns", 0),
        "episode_status": traj.status,
        "truncation_reason": traj.info.get("truncation_reason"),
        "patch_lines": patch.count("\n") if patch else 0,
        "patch_applied": report.get("patch_successfully_applied", bool(patch)),
        "error": infra,
        "seconds": round(traj.timings.get("total_s", 0.0), 2),
    }


# ---- run -------------------------------------------------------------------------------------------------------
def finished(out: Path) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(predictions, results) already in ``out`` by instance id (last line wins)."""
    preds = {r["instance_id"]: r for _, r in read_jsonl_records(out / "predictions.jsonl") if "instance_id" in r}
    results = {r["instance_id"]: r for _, r in read_jsonl_records(out / "results.jsonl") if "instance_id" in r}
    return preds, results


async def run_swebench(cfg: SWEEvalConfig) -> dict[str, Any]:
    """Run (or resume) the evaluation in ``cfg.out``; return the report (also written to ``report.json``)."""
    spec = parse_model_spec(cfg.model)
    records = load_swe_dataset(cfg.dataset, cfg.instances, cfg.split)
    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    preds, results = finished(out)
    done = {i for i, r in results.items() if i in preds and r.get("verdict") != "infra_error"}
    todo = [r for r in records if r["instance_id"] not in done]
    t0 = time.perf_counter()
    if todo:
        build = dict(tokenizer=cfg.tokenizer, max_context_tokens=cfg.max_context_tokens,
                     max_action_tokens=cfg.max_action_tokens, temperature=cfg.temperature,
                     turns_in_context=SWE_TURNS_IN_CONTEXT)  # fmt: skip
        async with opened_model(spec, [r["instance_id"] for r in todo], **build) as model:
            await _run_all(todo, model, cfg, len(records) - len(todo))
    preds, results = finished(out)
    ids = [r["instance_id"] for r in records]
    rows = [results[i] for i in ids if i in results]
    report = summarize(rows, ids, model=spec.name, dataset=cfg.dataset, skipped=len(records) - len(todo))
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    report["config"] = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}
    report["agent"] = describe_harness(cfg.agent, cfg.agent_config)  # which agent and which of its configs ran
    if cfg.harness and not preds:
        report["harness"] = None  # nothing finished without an infrastructure failure: nothing to grade
    elif cfg.harness:
        chosen = [preds[i] for i in ids if i in preds]
        report["harness"] = grade_with_harness(chosen, records, out / "harness", workers=cfg.workers)
        ours = {r["instance_id"]: r["verdict"] for r in rows}
        report["harness_disagreements"] = sorted(
            i for i, v in report["harness"]["verdicts"].items() if i in ours and v != ours[i]
        )
    write_json(out / "report.json", report)
    return report


async def _run_all(todo: list[dict[str, Any]], model: EvalModel, cfg: SWEEvalConfig, skipped: int) -> None:
    from sao.agent.episodes import Episode, EpisodeRunner, RunnerConfig, env_factory, is_last_row

    out = cfg.out
    if skipped:
        say(f"swebench: {skipped} instance(s) already done in {out}, {len(todo)} to run")
    make_env = env_factory(SWE_ENV, {"max_steps": cfg.max_steps, "grade_timeout_s": cfg.grade_timeout_s})
    # One turn past the env's step limit: the env's own limit ends (and grades) the episode first.
    player = model.player(max_turns=cfg.max_steps + 1, harness=cfg.agent, harness_config=cfg.agent_config)
    runner = EpisodeRunner(make_env, player, RunnerConfig(cfg.workers), out_path=out / "trajectories.jsonl")

    def finished_one(traj: Trajectory) -> None:
        if not is_last_row(traj):
            return  # every row of an outside agent's episode carries its outcome: one verdict, from the last
        rec = todo[int(traj.info["episode"])]
        result = result_of(rec["instance_id"], traj)
        if result["verdict"] != "infra_error":
            patch = (traj.info.get("report") or {}).get("model_patch", "")
            pred = {"instance_id": rec["instance_id"], "model_name_or_path": model.spec.name, "model_patch": patch}
            append_jsonl(out / "predictions.jsonl", pred)
        # The result line comes last: it marks the instance finished for a resumed run.
        append_jsonl(out / "results.jsonl", result)

    episodes = [Episode(i, rec, None, rec["instance_id"]) for i, rec in enumerate(todo)]
    await runner.run(episodes, on_trajectory=finished_one)


def summarize(
    rows: list[dict[str, Any]], ids: list[str], *, model: str, dataset: str, skipped: int = 0
) -> dict[str, Any]:
    """The report: totals and per-instance rows. ``resolved_rate`` is over all selected instances."""
    by = {
        v: sorted(r["instance_id"] for r in rows if r["verdict"] == v)
        for v in ("resolved", "unresolved", "infra_error")
    }
    n_res = len(by["resolved"])
    return {
        "model": model,
        "dataset": dataset,
        "total": len(ids),
        "resolved": n_res,
        "unresolved": len(by["unresolved"]),
        "infra_errors": len(by["infra_error"]),
        "not_run": sorted(set(ids) - {r["instance_id"] for r in rows}),
        "resolved_rate": n_res / len(ids) if ids else 0.0,
        "resolved_ids": by["resolved"],
        "unresolved_ids": by["unresolved"],
        "infra_error_ids": by["infra_error"],
        "skipped_already_done": skipped,
        "instances": rows,
    }


def grade_only(predictions: Path, dataset: str, out: Path, *, workers: int = 2, split: str = "test") -> dict[str, Any]:
    """``sao eval swebench --grade-only``: check the file, grade it with the harness, write ``report.json``."""
    records = load_swe_dataset(dataset, (), split)
    preds = load_predictions(predictions, {r["instance_id"] for r in records}, dataset)
    out.mkdir(parents=True, exist_ok=True)
    h = grade_with_harness(preds, records, out / "harness", workers=workers)
    rows = [
        {"instance_id": i, "verdict": v, "resolved": v == "resolved", "error": h["errors"].get(i)}
        for i, v in h["verdicts"].items()
    ]
    model = preds[0]["model_name_or_path"]
    report = summarize(rows, [p["instance_id"] for p in preds], model=model, dataset=dataset)
    report.update(predictions=str(predictions), grader="swebench.harness.run_evaluation", harness=h)
    write_json(out / "report.json", report)
    return report


def print_summary(report: dict[str, Any]) -> None:
    """One screen: a per-instance table, then resolved/total and the infra failures listed apart."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    agent = report.get("agent") or {}
    under = f" under {agent['harness']}" + (f" ({agent['config']})" if agent.get("config") else "") if agent else ""
    table = Table(title=f"SWE-bench eval: {report['model']}{under} on {report['dataset']}")
    for col in ("instance", "verdict", "turns", "patch lines", "seconds", "note"):
        table.add_column(col)
    style = {"resolved": "green", "unresolved": "yellow", "infra_error": "red"}
    for r in report["instances"]:
        note = r.get("error") or r.get("truncation_reason") or ""
        table.add_row(
            r["instance_id"], f"[{style[r['verdict']]}]{r['verdict']}", str(r.get("turns", "")),
            str(r.get("patch_lines", "")), str(r.get("seconds", "")), str(note)[:80],
        )  # fmt: skip
    console.print(table)
    console.print(
        f"[bold]resolved {report['resolved']}/{report['total']}[/bold] ({100 * report['resolved_rate']:.1f}%), "
        f"unresolved {report['unresolved']}, infra errors {report['infra_errors']}"
        + (f", not run {len(report['not_run'])}" if report.get("not_run") else "")
    )
    if report["infra_error_ids"]:
        console.print("[red]infrastructure failures (not counted as unresolved; rerun to retry):[/red]")
        for r in report["instances"]:
            if r["verdict"] == "infra_error":
                console.print(f"  {r['instance_id']}: {r.get('error')}")
    harness = report.get("harness")
    if harness:
        line = f"official harness: resolved {harness['resolved']}/{harness['total']}, "
        line += f"infra errors {harness['infra_errors']}"
        if "harness_disagreements" in report:
            line += f"; disagreements with the env grading: {report['harness_disagreements'] or 'none'}"
        console.print(line + f" (logs: {harness['logs_dir']})")
