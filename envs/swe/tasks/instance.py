"""SWE-bench-format instance records: the eval script, the issue-like problem statement, validation, JSONL I/O."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from sao.core.jsonl import iter_jsonl

REQUIRED_FIELDS = (
    "instance_id",
    "repo",
    "version",
    "base_commit",
    "problem_statement",
    "patch",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "image",
    "eval_script",
    "log_parser",
    "eval_type",
)
EVAL_TIMEOUT_S = 900


def eval_script(base_commit: str, test_files: list[str], test_ids: list[str] | None = None) -> str:
    """The bash script the swebench harness runs in the instance container (patch already applied).
    Test files are restored from ``base_commit`` first so a patch that edits tests cannot change the verdict.
    pytest runs ``test_ids`` when given (test ids of ``test_files``), else the whole files."""
    files = " ".join(shlex.quote(f) for f in test_files)
    selected = " ".join(shlex.quote(t) for t in test_ids) if test_ids else files
    return "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            "export PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 COLUMNS=200",
            "cd /testbed",
            "git config --global --add safe.directory /testbed",
            "git status",
            f"git -c core.fileMode=false diff {base_commit}",
            f"git checkout {base_commit} -- {files}",
            ": '>>>>> Start Test Output'",
            f"timeout {EVAL_TIMEOUT_S} python -m pytest -p no:cacheprovider -rA --tb=short {selected}",
            ": '>>>>> End Test Output'",
            f"git checkout {base_commit} -- {files}",
            "",
        ]
    )


def problem_statement(package: str, f2p: list[str], excerpts: list[tuple[str, list[str]]]) -> str:
    """An issue as a user would file it: what fails, which tests, the error messages. Never the patch."""
    first = f2p[0].split("::")[-1]
    more = f" and {len(f2p) - 1} other test{'s' if len(f2p) > 2 else ''}" if len(f2p) > 1 else ""
    lines = [
        f"`{first}`{more} fail in {package}",
        "",
        f"Running the test suite of {package} at the current commit, these tests fail:",
        "",
        *[f"- `{t}`" for t in f2p[:15]],
    ]
    if len(f2p) > 15:
        lines.append(f"- ... and {len(f2p) - 15} more")
    if excerpts:
        lines += ["", "The errors look like this:", ""]
        for title, errs in excerpts:
            lines += [f"`{title}`:", "```", *errs, "```", ""]
    lines += [
        "",
        "Expected: these tests pass, and the rest of the suite keeps passing. The tests describe the intended "
        "behaviour; the bug is in the library code.",
    ]
    return "\n".join(lines).rstrip() + "\n"


def changed_lines(patch: str) -> tuple[str, int, int] | None:
    """(file, first, last): the pre-image lines a one-hunk patch of one file removes or rewrites (1-based,
    inclusive); None for any other patch (several hunks or files, or a hunk that only adds lines)."""
    path, hunks, changed = None, 0, []
    line = 0
    for text in patch.splitlines():
        if text.startswith("+++ "):
            if path is not None:
                return None
            path = text[4:].removeprefix("b/")
        elif text.startswith("--- "):
            continue
        elif text.startswith("@@ -"):
            hunks += 1
            line = int(text[4:].split(",", 1)[0].split(" ", 1)[0])
        elif hunks and text[:1] in (" ", ""):
            line += 1
        elif hunks and text[:1] == "-":
            changed.append(line)
            line += 1
    if path is None or hunks != 1 or not changed:
        return None
    return path, changed[0], changed[-1]


HINTS = ("", "function", "line")


def line_hint(first: int, last: int) -> str:
    """The sentence a "line" hint adds: where the bug is (agents and the SWE demonstrator read it back)."""
    return f"The bug is on line {first}." if first == last else f"The bug is on lines {first}-{last}."


def with_location_hint(record: dict[str, Any], level: str = "function") -> dict[str, Any]:
    """A copy of one of our offline records whose problem statement also names where the failure comes from, as a
    report with a traceback into the library or a maintainer's first comment would: ``level`` "function" names the
    function holding the bug and its file (``sao_mutation``); "line" names the line(s) the bug is on too (a one-hunk
    patch; others get the function only). Never the fix. An easier task: with "function" the agent still has to read
    the function, find the wrong line and rewrite it; with "line" it has to read that line and rewrite it."""
    if level not in HINTS[1:]:
        raise ValueError(f"unknown location hint {level!r}; choose one of {', '.join(HINTS[1:])}")
    iid = record["instance_id"]
    meta = record.get("sao_mutation")
    if not meta or not meta.get("function") or not meta.get("path"):
        raise ValueError(
            f"task {iid!r} is not an offline SAO task naming its function (sao_mutation.function/path); a location "
            "hint needs one: turn the task set's `hint` off for it"
        )
    qualified = str(meta["function"])
    name = qualified.rsplit(".", 1)[-1]
    where = f"`{name}` (`{qualified}`)" if qualified != name else f"`{name}`"
    hint = f"The failure traces back to the function {where} in `{meta['path']}`."
    span = changed_lines(str(record.get("patch", ""))) if level == "line" else None
    if span is not None and span[0] == meta["path"]:
        _, first, last = span
        hint += " " + line_hint(first, last)
    return {**record, "problem_statement": record["problem_statement"].rstrip() + "\n\n" + hint + "\n"}


def _as_list(value: Any, field: str, iid: str) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"task {iid!r}: field {field} is a string but not a JSON list ({e})") from e
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"task {iid!r}: field {field} must be a list of test ids (or a JSON string of one)")
    return value


def validate_instance(record: Any) -> dict[str, Any]:
    """Check a SWE-bench-format record; raise ``ValueError`` naming what is missing or wrong and how to fix it."""
    if not isinstance(record, dict):
        raise ValueError(f"a task record must be a JSON object (dict), got {type(record).__name__}")
    iid = str(record.get("instance_id", "<no instance_id>"))
    missing = [f for f in REQUIRED_FIELDS if f not in record]
    if missing:
        raise ValueError(
            f"task {iid!r} lacks field(s) {', '.join(missing)}; a SWE-bench-format instance needs "
            f"{', '.join(REQUIRED_FIELDS)} (build one with `sao tasks build`, or use an official instance)"
        )
    for field in ("instance_id", "image", "eval_script", "log_parser", "eval_type", "repo", "base_commit"):
        if not isinstance(record[field], str) or not record[field].strip():
            raise ValueError(f"task {iid!r}: field {field} must be a non-empty string")
    f2p = _as_list(record["FAIL_TO_PASS"], "FAIL_TO_PASS", iid)
    _as_list(record["PASS_TO_PASS"], "PASS_TO_PASS", iid)
    if not f2p:
        raise ValueError(f"task {iid!r}: FAIL_TO_PASS is empty, so no patch could ever be graded as a fix")
    if ">>>>> Start Test Output" not in record["eval_script"] or ">>>>> End Test Output" not in record["eval_script"]:
        raise ValueError(f"task {iid!r}: eval_script lacks the '>>>>> Start/End Test Output' markers the grader needs")
    from swebench.harness.constants import EvalType
    from swebench.harness.log_parsers import PARSER_REGISTRY

    if record["log_parser"] not in PARSER_REGISTRY:
        raise ValueError(f"task {iid!r}: unknown log_parser {record['log_parser']!r}; e.g. parse_log_pytest")
    if record["eval_type"] not in {e.value for e in EvalType}:
        raise ValueError(f"task {iid!r}: eval_type must be one of {[e.value for e in EvalType]}")
    return record


def with_test_sample(record: dict[str, Any], pass_to_pass: list[str]) -> dict[str, Any]:
    """A copy of one of our offline records (``sao_mutation``) whose eval script runs only its FAIL_TO_PASS and
    the given PASS_TO_PASS tests, and whose report counts only those: a faster reward for training. Records made
    elsewhere carry their own eval scripts, which cannot be cut safely: they raise ``ValueError``."""
    iid = record["instance_id"]
    if "sao_mutation" not in record:
        raise ValueError(
            f"task {iid!r} is not an offline SAO task (no sao_mutation): its eval script cannot run a sample of "
            "PASS_TO_PASS; set the env's pass_to_pass_sample to null for it"
        )
    f2p = _as_list(record["FAIL_TO_PASS"], "FAIL_TO_PASS", iid)
    every = set(_as_list(record["PASS_TO_PASS"], "PASS_TO_PASS", iid))
    unknown = [t for t in pass_to_pass if t not in every]
    if unknown:
        raise ValueError(f"task {iid!r}: {unknown[:3]} are not PASS_TO_PASS tests of it")
    ids = [*f2p, *pass_to_pass]
    files = sorted({t.split("::")[0] for t in ids})
    script = eval_script(record["base_commit"], files, test_ids=ids)
    return {**record, "PASS_TO_PASS": list(pass_to_pass), "eval_script": script}


def with_official_image(record: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``record`` with ``image`` filled in, when absent, by the official SWE-bench naming
    (``swebench/sweb.eval.x86_64.<id>:latest``), as for instances of SWE-bench Verified."""
    if record.get("image") or not isinstance(record.get("instance_id"), str):
        return record
    from swebench.task.checks import expected_image

    return {**record, "image": expected_image(record["instance_id"])}


def load_instances(path: str | Path) -> list[dict[str, Any]]:
    """Read and validate a JSONL (or JSON list) of instances; errors name the file and line."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"task file {p} does not exist; build one with `sao tasks build --out {p}`")
    text = p.read_text()
    if p.suffix == ".json":
        data = json.loads(text)
        records = data if isinstance(data, list) else [data]
        return [validate_instance(r) for r in records]
    out = []
    for n, rec in iter_jsonl(p):
        try:
            out.append(validate_instance(rec))
        except ValueError as e:
            raise ValueError(f"{p}:{n}: {e}") from e
    return out


def append_instance(path: Path, record: dict[str, Any]) -> None:
    """Append one record durably (flushed and fsynced) so an interrupted build keeps what it made."""
    from sao.core.jsonl import append_jsonl

    path.parent.mkdir(parents=True, exist_ok=True)
    append_jsonl(path, [record])
