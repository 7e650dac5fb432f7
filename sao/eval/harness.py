"""Grade SWE-bench predictions with the official harness (``python -m swebench.harness.run_evaluation``).

``load_predictions`` checks a predictions file line by line (JSON, the three official keys, known instance ids, no
duplicates) and raises ``EvalError`` naming the line and the fix. ``grade_with_harness`` cuts each patch to source
with the patch policy of the training reward (``sao.envs.swe.patch_policy``; ``dropped`` in its answer says what and
why), writes the exact instance records to ``<dir>/dataset.jsonl``, runs the harness in ``<dir>`` (its
``logs/run_evaluation/`` tree and report land there), and reads each instance's ``report.json``: resolved / unresolved
(an empty patch, or a patch that did not apply, is unresolved) / infra_error (the harness produced no report for
another reason). The run id is derived from the graded predictions, so a rerun reuses the harness's finished reports.
``sao eval swebench --grade-only`` (``sao.eval.swebench_eval.grade_only``) is built on these two.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sao.core.console import ProgressLine
from sao.core.jsonl import iter_jsonl, write_text_durably
from sao.core.tether import popen_tethered, stop_group
from sao.eval.common import EvalError

KEYS = ("instance_id", "model_name_or_path", "model_patch")
FIX = 'each line must be one JSON object {"instance_id": str, "model_name_or_path": str, "model_patch": str}'


def load_predictions(path: Path, known_ids: set[str], dataset: str) -> list[dict[str, Any]]:
    """Read and check a predictions ``.jsonl`` (or ``.json`` list / id->prediction dict)."""
    if not path.is_file():
        raise EvalError(f"predictions file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    entries: list[tuple[str, Any]] = []
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise EvalError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); {FIX}") from e
        items = list(data.values()) if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise EvalError(f"{path}: a .json predictions file must hold a list of predictions; {FIX}")
        entries = [(f"{path}: item {i}", p) for i, p in enumerate(items)]
    else:
        entries = [(f"{path}:{n}", p) for n, p in iter_jsonl(path, error=EvalError, fix=FIX)]
    seen: dict[str, str] = {}
    preds = []
    for where, p in entries:
        if not isinstance(p, dict):
            raise EvalError(f"{where}: a prediction must be a JSON object, got {type(p).__name__}; {FIX}")
        lacking = [k for k in KEYS if k not in p]
        if lacking:
            raise EvalError(f"{where}: missing key(s) {', '.join(lacking)}; {FIX}")
        if not isinstance(p["instance_id"], str) or not isinstance(p["model_name_or_path"], str):
            raise EvalError(f"{where}: instance_id and model_name_or_path must be strings; {FIX}")
        if p["model_patch"] is not None and not isinstance(p["model_patch"], str):
            raise EvalError(f"{where}: model_patch must be a string (a unified diff) or null; {FIX}")
        iid = p["instance_id"]
        if iid not in known_ids:
            raise EvalError(
                f"{where}: instance_id {iid!r} is not in the dataset {dataset}; pass the --dataset the predictions "
                "were made on, or delete that line"
            )
        if iid in seen:
            raise EvalError(
                f"{where}: instance_id {iid!r} appears again (first at {seen[iid]}); keep one line per instance"
            )
        seen[iid] = where
        preds.append({k: p[k] for k in KEYS})
    if not preds:
        raise EvalError(f"{path}: no predictions in the file; {FIX}")
    return preds


def _run_id(preds: list[dict[str, Any]]) -> str:
    digest = hashlib.sha256(json.dumps(preds, sort_keys=True).encode()).hexdigest()[:12]
    return f"sao-{digest}"


def _cut_to_source(preds: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(the predictions with each patch cut by the patch policy, ``{"dropped": ..., "tamper_signals": ...}`` by
    instance id, for the instances that have any)."""
    from sao.envs.swe.patch_policy import apply_policy

    notes: dict[str, Any] = {"dropped": {}, "tamper_signals": {}}
    graded = []
    for p in preds:
        policy = apply_policy(p["model_patch"] or "")
        if policy.dropped:
            notes["dropped"][p["instance_id"]] = policy.report()
        if policy.signals:
            notes["tamper_signals"][p["instance_id"]] = list(policy.signals)
        graded.append({**p, "model_patch": policy.patch})
    return graded, notes


def grade_with_harness(
    preds: list[dict[str, Any]], records: list[dict[str, Any]], workdir: Path, *, workers: int = 2,
    timeout_s: int = 1800,
) -> dict[str, Any]:  # fmt: skip
    """Grade ``preds`` on ``records`` with the official harness run in ``workdir``; return counts and verdicts.
    The harness grades each patch cut to source by the training reward's patch policy (``dropped``: the rest)."""
    from swebench.harness.constants import APPLY_PATCH_FAIL, LOG_INSTANCE, LOG_REPORT, RUN_EVALUATION_LOG_DIR

    preds, notes = _cut_to_source(preds)
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    by_id = {r["instance_id"]: r for r in records}
    dataset_file = workdir / "dataset.jsonl"
    write_text_durably(dataset_file, "".join(json.dumps(by_id[p["instance_id"]]) + "\n" for p in preds))
    preds_file = workdir / "predictions.jsonl"
    write_text_durably(preds_file, "".join(json.dumps(p) + "\n" for p in preds))
    run_id = _run_id(preds)
    cmd = [
        sys.executable, "-m", "swebench.harness.run_evaluation", "-d", str(dataset_file), "-p", str(preds_file),
        "-id", run_id, "--max_workers", str(workers), "-t", str(timeout_s), "--report_dir", str(workdir),
    ]  # fmt: skip
    log_path = workdir / "run_evaluation.log"

    def log_dir(p: dict[str, Any]) -> Path:
        model = p["model_name_or_path"].replace("/", "__")
        return Path(workdir, RUN_EVALUATION_LOG_DIR, run_id, model, p["instance_id"])

    t0 = time.perf_counter()
    with open(log_path, "ab") as log, ProgressLine("harness", len(preds)) as bar:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        # tethered: the harness and its workers end with this process, even when it is killed with SIGKILL
        proc = popen_tethered(cmd, cwd=workdir, stdout=log, stderr=subprocess.STDOUT)
        try:
            while proc.poll() is None:
                bar.update(sum((log_dir(p) / LOG_REPORT).exists() for p in preds))
                time.sleep(1.0)
        except BaseException:  # Ctrl-C, SIGTERM raised as an exception, a failed progress update
            stop_group(proc)
            raise
        bar.update(len(preds))
    if proc.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
        raise EvalError(f"the official harness failed (exit {proc.returncode}); log {log_path}:\n{tail}")
    verdicts: dict[str, str] = {}
    errors: dict[str, str] = {}
    for p in preds:
        iid, d = p["instance_id"], log_dir(p)
        if not (p["model_patch"] or "").strip():
            verdicts[iid] = "unresolved"
            continue
        if (d / LOG_REPORT).exists():
            try:
                verdicts[iid] = (
                    "resolved" if json.loads((d / LOG_REPORT).read_text())[iid]["resolved"] else "unresolved"
                )
                continue
            except (json.JSONDecodeError, KeyError) as e:
                errors[iid] = f"unreadable harness report {d / LOG_REPORT} ({e})"
        inst_log = (d / LOG_INSTANCE).read_text(errors="replace") if (d / LOG_INSTANCE).exists() else ""
        if APPLY_PATCH_FAIL in inst_log:
            verdicts[iid] = "unresolved"  # the model's patch does not apply: the model's failure, not the infra's
            continue
        verdicts[iid] = "infra_error"
        last = inst_log.strip().splitlines()[-1][:300] if inst_log.strip() else "no instance log"
        errors.setdefault(iid, f"the harness made no report ({last}); see {d / LOG_INSTANCE if inst_log else log_path}")
    count = {v: sum(x == v for x in verdicts.values()) for v in ("resolved", "unresolved", "infra_error")}
    return {
        "run_id": run_id,
        "total": len(preds),
        "resolved": count["resolved"],
        "unresolved": count["unresolved"],
        "infra_errors": count["infra_error"],
        "verdicts": verdicts,
        "errors": errors,
        **notes,
        "log": str(log_path),
        "logs_dir": str(workdir / RUN_EVALUATION_LOG_DIR / run_id),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
