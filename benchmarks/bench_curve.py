"""`sao bench curve RUN`: does RL help, then hurt, or never help? Held-out success of every policy a staged run
exported during RL (``run.export_every``), on the first ``n`` of the run's own held-out tasks (the same tasks at every
step), beside the SFT and final evals on those tasks; and what the failing episodes get wrong.

Failure kinds (``failure_kind``, Python-tool arithmetic episodes): ``format`` (no action is a call of a tool of the
env and nothing was graded), ``head_arithmetic`` (answered without running the tool, wrongly), ``copy_error`` (the
tool printed the right number, the answer differs), ``wrong_expression`` (the tool ran, never printed the right
number, and the answer is wrong), ``no_answer`` (the tool printed the right number, no answer was given: a limit
ended the episode). The same kinds are counted in the SFT eval, the final eval and the RL batches, so the table says
whether the failures RL could fix ever reach its batches.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path
from typing import Any

from sao.agent.records import Trajectory, read_jsonl
from sao.core.jsonl import iter_jsonl, write_json_atomic
from sao.envs.protocols import FormatError
from sao.envs.python_tool import PythonToolEnv
from sao.envs.tools.parsing import parse_action
from sao.eval.scores import paired_difference, task_success_se
from sao.trainer.config import Config, ConfigError, load_config
from sao.trainer.runs.metrics import read_metrics
from sao.trainer.runs.stages import eval_stage, held_out_tasks, training_tasks

KINDS = ("solved", "format", "head_arithmetic", "copy_error", "wrong_expression", "no_answer", "infra_error")


def failure_kind(traj: Trajectory, decode: Any, gold: str = "") -> str:
    """What went wrong in one Python-tool episode (see the module doc); ``decode``: token ids -> text; ``gold``: the
    task's answer (an ungraded episode's record does not hold it)."""
    if traj.status == "infra_error":
        return "infra_error"
    if traj.info.get("solved"):
        return "solved"
    report = traj.info.get("report") or {}
    gold, prediction = str(report.get("gold", gold)), str(report.get("prediction", "")).strip()
    ran = False
    for seg in traj.action_segments:
        try:
            ran |= parse_action(decode(list(seg.token_ids)), PythonToolEnv.fenced).name == "python"
        except FormatError:
            continue
    shown = " ".join(decode(list(s.token_ids)) for s in traj.segments if s.kind == "observation")
    gold_shown = bool(gold) and gold in shown
    if not ran:
        return "head_arithmetic" if prediction else "format"
    if not gold_shown:
        return "wrong_expression"
    return "copy_error" if prediction else "no_answer"


def kind_counts(trajs: list[Trajectory], decode: Any, answers: dict[str, str] | None = None) -> dict[str, int]:
    """Episodes of each kind; ``answers``: task id -> gold answer."""
    counts = Counter(failure_kind(t, decode, (answers or {}).get(t.task_id, "")) for t in trajs)
    return {k: counts.get(k, 0) for k in KINDS}


def _stage_dir(run_dir: Path, stage: str, which: int) -> Path:
    dirs = sorted(run_dir.glob(f"[0-9][0-9]_{stage}"))
    if not dirs:
        raise ConfigError(
            f"{run_dir}: no {stage} stage folder (NN_{stage}); pass a staged run (`sao train` with stages)"
        )
    return dirs[which]


def policies(train_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every policy the train stage exported, in step order."""
    found = sorted((int(p.name.split("_")[1]), p) for p in (train_dir / "policies").glob("step_*") if p.is_dir())
    if not found:
        raise ConfigError(
            f"{train_dir}/policies holds no exported policy; run the job with run.export_every=1 "
            "(e.g. `sao train configs/quickstart.yaml run.export_every=1`)"
        )
    return found


def _ledger_trajectories(path: Path) -> list[Trajectory]:
    """Every episode a train stage's ledger recorded (its trajectory lines; events are skipped)."""
    return [Trajectory.from_dict(rec["trajectory"]) for _, rec in iter_jsonl(path, torn_tail_ok=True)
            if rec.get("type") == "trajectory"]  # fmt: skip


def _on_tasks(solved_by_task: dict[str, float], ids: list[str]) -> dict[str, float]:
    return {k: solved_by_task[k] for k in ids if k in solved_by_task}


def _point(label: str, step: int, solved: dict[str, float], sft: dict[str, float]) -> dict[str, Any]:
    p = sum(solved.values()) / max(len(solved), 1)
    diff, se, _ = paired_difference(sft, solved)
    return {"label": label, "step": step, "episodes": len(solved), "success": p,
            "se": task_success_se(solved), "vs_sft": diff, "vs_sft_se": se, "solved_by_task": solved}  # fmt: skip


def sft_eval_dir(run_dir: Path, given: Path | None = None) -> Path:
    """The eval the curve pairs against: ``given``, else the run's first eval stage when it ran before the train
    stage. A `sao bench confirm` arm has no eval of its own before RL (its start is the shared SFT checkpoint), so it
    is refused with the fix."""
    if given is not None:
        if not (given / "done.json").is_file():
            raise ConfigError(f"--sft-eval {str(given)!r}: no finished eval stage there (no done.json); pass an "
                              "NN_eval folder of the run whose SFT checkpoint this run started from")  # fmt: skip
        return given
    first, train = _stage_dir(run_dir, "eval", 0), _stage_dir(run_dir, "train", -1)
    if first.name < train.name:
        return first
    raise ConfigError(
        f"{run_dir}: no eval stage before its train stage (a `sao bench confirm` arm starts from the shared SFT "
        "checkpoint); pass the SFT eval with --sft-eval, e.g. --sft-eval CONFIRM_OUT/shared/02_eval or the NN_eval "
        "folder after SFT of the run given to --from-run"
    )


def curve(run_dir: Path, n: int, out: Path, sft_eval: Path | None = None) -> dict[str, Any]:
    """Evaluate every exported policy of ``run_dir``'s (last) train stage on its first ``n`` held-out tasks, paired
    with the SFT eval (``sft_eval_dir``); write ``curve.json`` and ``curve.png`` into ``out``."""
    from sao.trainer.learn.models import load_tokenizer

    cfg: Config = load_config(run_dir / "config.yaml")
    full = held_out_tasks(cfg)
    if not 1 <= n <= len(full):
        raise ConfigError(f"--n {n}: the run has {len(full)} held-out tasks; pass 1..{len(full)}")
    small = copy.deepcopy(cfg)
    small.eval.n = n
    ids = [str(t.get("id", t.get("instance_id"))) for t in held_out_tasks(small)]
    train_dir = _stage_dir(run_dir, "train", -1)
    sft_eval, final_eval = sft_eval_dir(run_dir, sft_eval), _stage_dir(run_dir, "eval", -1)
    sft_solved = _on_tasks(json.loads((sft_eval / "done.json").read_text())["solved_by_task"], ids)
    if not sft_solved:  # e.g. another eval.seed: nothing to pair with, not a curve paired on nothing
        raise ConfigError(f"{sft_eval}: none of the run's {len(ids)} held-out tasks is in this eval; pass the eval of "
                          "the SFT checkpoint this run started from, on the same eval.seed")  # fmt: skip
    points = [_point("after SFT", 0, sft_solved, sft_solved)]
    metrics = {int(r["step"]): r for r in read_metrics(train_dir) if "step" in r}
    for step, path in policies(train_dir):
        c = copy.deepcopy(small)
        c.model.path = str(path)
        c.run.progress = False
        where = out / f"step_{step:04d}"
        where.mkdir(parents=True, exist_ok=True)
        res = eval_stage(c, str(path), where)
        point = _point(f"RL step {step}", step, _on_tasks(res["solved_by_task"], ids), sft_solved)
        point["batch_success"] = metrics.get(step, {}).get("success_rate")
        points.append(point)
        print(f"step {step}: held-out {point['success']:.3f} (vs SFT {point['vs_sft']:+.3f})", flush=True)
    tok = load_tokenizer(cfg)

    def decode(ids_: list[int]) -> str:
        return str(tok.decode(ids_, skip_special_tokens=True))

    answers = {str(t.get("id")): str(t.get("answer", "")) for t in [*full, *training_tasks(cfg)]}
    kinds = {
        "after SFT (held-out)": kind_counts(list(read_jsonl(sft_eval / "trajectories.jsonl")), decode, answers),
        "RL batches": kind_counts(_ledger_trajectories(train_dir / "trajectories.jsonl"), decode, answers),
        "after RL (held-out)": kind_counts(list(read_jsonl(final_eval / "trajectories.jsonl")), decode, answers),
    }
    result = {"run": str(run_dir), "n": n, "points": points, "failure_kinds": kinds}
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "curve.json", result)
    plot_curve(result, out / "curve.png")
    return result


def plot_curve(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = result["points"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.errorbar([p["step"] for p in pts], [p["success"] for p in pts], yerr=[p["se"] for p in pts],
                marker="o", capsize=3, label=f"held-out success ({result['n']} tasks)")  # fmt: skip
    batch = [(p["step"], p["batch_success"]) for p in pts if p.get("batch_success") is not None]
    if batch:
        ax.plot(*zip(*batch, strict=True), marker="x", linestyle="--", label="RL batch success")
    ax.set_xlabel("RL policy step (0 = after SFT)")
    ax.set_ylabel("success")
    ax.set_ylim(0, 1.05)
    ax.legend()
    ax.set_title("held-out success along RL")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def curve_table(result: dict[str, Any]) -> str:
    lines = ["| policy | held-out success | vs after SFT (paired) | RL batch success |", "|---|---|---|---|"]
    for p in result["points"]:
        batch = "-" if p.get("batch_success") is None else f"{p['batch_success']:.3f}"
        lines.append(f"| {p['label']} | {p['success']:.3f} ± {p['se']:.3f} | {p['vs_sft']:+.3f} ± {p['vs_sft_se']:.3f} "
                     f"| {batch} |")  # fmt: skip
    lines += ["", "| episodes | " + " | ".join(KINDS) + " |", "|---|" + "---|" * len(KINDS)]
    for name, counts in result["failure_kinds"].items():
        lines.append(f"| {name} | " + " | ".join(str(counts[k]) for k in KINDS) + " |")
    return "\n".join(lines)
