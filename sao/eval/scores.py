"""Scores of a set of evaluation episodes: success, valid tool-call rate, turns, tokens, truncation, and for SWE-style
tasks the share of patches that touched the bug's file and the resolved rate per injected bug family. The one scorer:
`sao eval`, the staged run's eval stages and the benches read episodes through it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sao.agent.records import Trajectory


def patched_files(patch: str) -> set[str]:
    """The existing files a unified diff changes (swebench's own reading of a patch); none for an empty or
    unreadable one (a model's patch may be either)."""
    from swebench.utils import get_modified_files
    from unidiff.errors import UnidiffParseError

    try:
        return set(get_modified_files(patch)) if patch else set()
    except UnidiffParseError:
        return set()


def episode_scores(
    trajs: list[Trajectory], tokenizer: Any, tasks: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Success rate, valid tool-call rate (episodes with at least one action that parses as a call of one of
    the env's tools; for an outside agent's episode, one whose agent ran at least one command), mean turns, tokens
    per episode and the observations' share of them, truncated episodes, over the episodes that were not infra
    errors. The rows of one outside agent's episode (``info["session_id"]``) count as one episode: its outcome from
    its last row, its tokens and actions from all of them. With SWE-style ``tasks`` (a gold ``patch``) also the share of
    episodes whose graded patch (``info["report"]["model_patch"]``) changed a file the gold patch changes, and with
    injected-bug tasks the resolved / episodes of each bug family (``solved_by_family``). With tasks of graded
    difficulty (a ``level`` in the task record or the episode's info) also ``by_level`` (episodes, success, valid
    tool-call rate per level) and ``level_by_task``.

    A task played several times (``eval.samples``) is one unit: ``solved_by_task`` holds its solved fraction, and
    ``success_se`` is the standard error over tasks of those fractions (with one episode a task, the binomial SE);
    ``tasks`` counts them."""
    rows_of = _rows_by_episode([t for t in trajs if t.status != "infra_error"])
    ok = [rows[-1] for rows in rows_of]
    valid_flags = [_made_valid_call(t, tokenizer) for t in ok]
    valid = sum(valid_flags)
    n = max(len(ok), 1)
    every = [t for rows in rows_of for t in rows]
    obs = sum(len(seg.token_ids) for t in every for seg in t.segments if seg.kind == "observation")
    solved = solved_by_task(ok)
    out: dict[str, Any] = {
        "episodes": len(ok),
        "tasks": len({t.task_id for t in ok}),
        "infra_errors": sum(t.status == "infra_error" for t in trajs),
        "success": sum(bool(t.info.get("solved")) for t in ok) / n,
        "success_se": task_success_se(solved),
        "valid_tool_call_rate": valid / n,
        "mean_turns": sum(int(t.info.get("turns", 0)) for t in ok) / n,
        # cut by the env's wall-clock limit: on a loaded machine this scores correct work 0, so tables show it
        "time_limited": sum(t.info.get("truncation_reason") == "time_limit" for t in ok),
        "solved_by_task": solved,
        "truncated": sum(t.status == "truncated" for t in ok),
        "tokens_per_episode": sum(t.num_tokens for t in every) / n,
        "observation_share": obs / max(sum(t.num_tokens for t in every), 1),
    }
    level = task_levels(tasks) | {t.task_id: int(t.info["level"]) for t in ok if t.info.get("level") is not None}
    if level:
        out["level_by_task"] = {t.task_id: level[t.task_id] for t in ok if t.task_id in level}
        out["by_level"] = _by_level(ok, valid_flags, level)
    gold = {
        str(t.get("instance_id")): patched_files(str(t["patch"]))
        for t in tasks or []
        if isinstance(t, dict) and t.get("patch")
    }
    if gold:
        graded = [t for t in ok if t.task_id in gold]
        edited = sum(
            bool(gold[t.task_id] & patched_files(str((t.info.get("report") or {}).get("model_patch") or "")))
            for t in graded
        )
        out["edited_bug_file_rate"] = edited / max(len(graded), 1)
    family = {str(t.get("instance_id")): f for t in tasks or [] if isinstance(t, dict) and (f := bug_family(t))}
    if family:
        by: dict[str, list[int]] = {}
        for t in ok:
            if t.task_id in family:
                solved_n = by.setdefault(family[t.task_id], [0, 0])
                solved_n[0] += int(bool(t.info.get("solved")))
                solved_n[1] += 1
        out["solved_by_family"] = dict(sorted(by.items()))
    return out


def solved_by_task(eps: Sequence[Trajectory]) -> dict[str, float]:
    """Each task's solved fraction over its episodes (``solved_fractions``)."""
    return solved_fractions((t.task_id, bool(t.info.get("solved"))) for t in eps)


def solved_fractions(outcomes: Iterable[tuple[str, bool]]) -> dict[str, float]:
    """``(task id, solved)`` per episode -> each task's solved fraction (one episode: 0 or 1), in order of first
    appearance: the one rule for the scorer and for `sao view`'s compare."""
    by: dict[str, list[int]] = {}
    for task_id, ok in outcomes:
        by.setdefault(task_id, []).append(int(ok))
    return {k: (v[0] if len(v) == 1 else sum(v) / len(v)) for k, v in by.items()}


def task_success_se(solved: dict[str, float]) -> float:
    """The standard error of the mean of per-task solved fractions: the binomial SE when every task is 0 or 1 (one
    episode a task), else the SE over tasks (a task's episodes share its difficulty, so they are not independent
    draws; counting them as such would understate the SE)."""
    xs = list(solved.values())
    if not xs:
        return 0.0
    m = sum(xs) / len(xs)
    if all(x in (0, 1) for x in xs):
        return float((m * (1 - m) / len(xs)) ** 0.5)
    return float((sum((x - m) ** 2 for x in xs) / max(len(xs) - 1, 1) / len(xs)) ** 0.5)


def _made_valid_call(t: Trajectory, tokenizer: Any) -> bool:
    """Whether some action of the episode parses as a call of one of its env's tools (an outside agent parses its
    own actions: whether it ran a command)."""
    from sao.envs.protocols import FormatError
    from sao.envs.python_tool import PythonToolEnv
    from sao.envs.tools.parsing import parse_action

    if "harness" in t.info:
        return int(t.info.get("turns", 0)) > 0
    names = {s["function"]["name"] for s in t.info.get("tools") or []}
    for seg in t.action_segments:
        try:
            call = parse_action(tokenizer.decode(list(seg.token_ids), skip_special_tokens=True), PythonToolEnv.fenced)
        except FormatError:
            continue
        if call.name in names:
            return True
    return False


def task_levels(tasks: list[dict[str, Any]] | None) -> dict[str, int]:
    """Task id -> difficulty level of the tasks that have one (``arithmetic_chain``)."""
    return {str(t["id"]): int(t["level"]) for t in tasks or [] if isinstance(t, dict) and t.get("level") is not None}


def _by_level(ok: list[Trajectory], valid: list[bool], level: dict[str, int]) -> dict[str, dict[str, float]]:
    """Episodes, success and valid tool-call rate per difficulty level (keys are the levels as strings: JSON)."""
    groups: dict[int, list[tuple[Trajectory, bool]]] = {}
    for t, v in zip(ok, valid, strict=True):
        if t.task_id in level:
            groups.setdefault(level[t.task_id], []).append((t, v))
    out: dict[str, dict[str, float]] = {}
    for lv, g in sorted(groups.items()):
        solved = solved_by_task([t for t, _ in g])
        out[str(lv)] = {
            "episodes": len(g),
            "tasks": len(solved),
            "success": sum(bool(t.info.get("solved")) for t, _ in g) / len(g),
            "success_se": task_success_se(solved),
            "valid_tool_call_rate": sum(v for _, v in g) / len(g),
        }
    return out


def level_table(results: list[dict[str, Any]]) -> str:
    """Success (± binomial SE) and valid tool-call rate per difficulty level, one row per eval; with two or more
    evals, the paired difference last - first per level. Empty when no eval has levels."""
    levels = sorted({int(lv) for r in results for lv in r.get("by_level") or {}})
    if not levels:
        return ""
    head = "| model | " + " | ".join(f"level {lv}: success (valid calls)" for lv in levels) + " |"
    lines = [head, "|---|" + "---|" * len(levels)]
    for r in results:
        cells = []
        for lv in levels:
            g = (r.get("by_level") or {}).get(str(lv))
            if g is None:
                cells.append("-")
                continue
            p, n = float(g["success"]), max(int(g["episodes"]), 1)
            se = float(g.get("success_se", (p * (1 - p) / n) ** 0.5))
            cells.append(f"{p:.3f} ± {se:.3f} ({g['valid_tool_call_rate']:.2f}, n={n})")
        lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    first, last = results[0], results[-1]
    if len(results) >= 2 and "level_by_task" in first and "level_by_task" in last:
        cells = []
        for lv in levels:
            ids = {k for k, v in last["level_by_task"].items() if v == lv}
            before = {k: v for k, v in first["solved_by_task"].items() if k in ids}
            mean, se, n = paired_difference(before, {k: v for k, v in last["solved_by_task"].items() if k in ids})
            cells.append(f"{mean:+.3f} ± {se:.3f} (n={n})" if n else "-")
        lines.append(f"| {last['label']} - {first['label']} (paired) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _rows_by_episode(trajs: list[Trajectory]) -> list[list[Trajectory]]:
    """The trajectories grouped by episode, in order of first appearance: an outside agent's rows by their gateway
    session (ordered by ``info["row"]``), any other trajectory alone."""
    groups: dict[Any, list[Trajectory]] = {}
    for i, t in enumerate(trajs):
        groups.setdefault(t.info.get("session_id") or ("alone", i), []).append(t)
    return [sorted(g, key=lambda t: int(t.info.get("row", 0))) for g in groups.values()]


def bug_family(task: dict[str, Any]) -> str | None:
    """The injected bug's family of an offline SWE task (``sao_mutation.operator``: comparison_flip, swapped_args,
    ...), None for tasks without one (SWE-bench's own, arithmetic)."""
    mutation = task.get("sao_mutation")
    op = mutation.get("operator") if isinstance(mutation, dict) else None
    return str(op) if op else None


def score_table(results: list[dict[str, Any]]) -> str:
    """The evals as a Markdown table (success with its binomial standard error; an SWE eval's rate of episodes
    that edited the bug's file, when its summary has one)."""
    swe = any("edited_bug_file_rate" in r for r in results)
    lines = [
        "| model | held-out episodes | success | valid tool-call rate | mean turns | tokens/episode | observation "
        "share | truncated | cut by time limit |" + (" edited the bug's file |" if swe else ""),
        "|---|---|---|---|---|---|---|---|---|" + ("---|" if swe else ""),
    ]
    for r in results:
        n, p = max(int(r["episodes"]), 1), float(r["success"])
        se = float(r.get("success_se", (p * (1 - p) / n) ** 0.5))
        tokens = f"{r['tokens_per_episode']:.0f}" if "tokens_per_episode" in r else "-"
        share = f"{r['observation_share']:.3f}" if "observation_share" in r else "-"
        lines.append(
            f"| {r['label']} | {r['episodes']} | {p:.3f} ± {se:.3f} | {r['valid_tool_call_rate']:.3f} | "
            f"{r['mean_turns']:.2f} | {tokens} | {share} | {r.get('truncated', '-')} | {r.get('time_limited', 0)} |"
            + (f" {r['edited_bug_file_rate']:.3f} |" if "edited_bug_file_rate" in r else (" - |" if swe else ""))
        )
    return "\n".join(lines)


def paired_difference(before: dict[str, float], after: dict[str, float]) -> tuple[float, float, int]:
    """Mean of ``after - before`` over the tasks both evals ran (each task's solved fraction: 0 or 1 with one
    episode a task), its standard error over tasks, and the count: the two evals run the same held-out tasks, so the
    paired difference is the sharper test."""
    return pooled_paired_difference([(before, after)])


def pooled_paired_difference(
    pairs: Sequence[tuple[dict[str, float], dict[str, float]]],
) -> tuple[float, float, int]:
    """The paired difference over several seeds: for each task every pair ran, the mean of ``after - before``
    over the pairs, then the mean over tasks and its standard error over tasks. The task is the unit, so seeds
    that share one ``before`` eval (RL seeds from one SFT checkpoint) are not counted as independent samples."""
    if not pairs:
        return float("nan"), float("nan"), 0
    common = sorted(set.intersection(*(set(b) & set(a) for b, a in pairs)))
    if not common:
        return float("nan"), float("nan"), 0
    d = [sum(a[k] - b[k] for b, a in pairs) / len(pairs) for k in common]
    mean = sum(d) / len(d)
    var = sum((x - mean) ** 2 for x in d) / max(len(d) - 1, 1)
    return mean, (var / len(d)) ** 0.5, len(d)
