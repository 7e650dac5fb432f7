"""`scripts/gpu_check.sh`'s table: the parts' exit codes, the gpu tests' JUnit results and ``bench.json`` in one report.

Reads only files (no torch): it runs last, also when a part before it failed or was killed at its time limit, and
writes ``OUT/gpu_check.md`` and ``OUT/gpu_check.json``. Exit status 0 only if every part exited 0, no test failed
or errored, and every model measured every length.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from sao.core.jsonl import write_text_durably

TIMEOUT_RCS = (124, 137)  # `timeout` reports a part it stopped (SIGTERM, then SIGKILL) with these


def parse_parts(spec: str) -> dict[str, dict[str, Any]]:
    """``"install=0:12 tests=1:80"`` (name=rc:seconds, rc ``skip`` for a part not run) -> records."""
    out: dict[str, dict[str, Any]] = {}
    for item in spec.split():
        name, _, rest = item.partition("=")
        rc, _, secs = rest.partition(":")
        if not name or not rc or not secs:
            raise ValueError(f"--parts: {item!r} is not name=rc:seconds (e.g. tests=0:41)")
        out[name] = {"rc": None if rc == "skip" else int(rc), "seconds": float(secs)}
    return out


def junit_cases(path: Path) -> list[dict[str, str]]:
    """Each test case of a pytest ``--junitxml`` file: its id, outcome and (for the others than passed) message."""
    if not path.is_file():
        return []
    cases = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            node = tc.find(kind)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                text = (node.get("message") or node.text or "").strip()
                message = text.splitlines()[0][:300] if text else ""
                break
        cases.append(
            {"test": f"{tc.get('classname', '')}::{tc.get('name', '')}", "outcome": outcome, "message": message}
        )
    return cases


def _gib(x: Any) -> str:
    return f"{x / 2**30:.2f}" if isinstance(x, int | float) else str(x)


def _ms(x: float) -> str:
    return f"{x * 1000:.0f}"


def _model_rows(bench: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Markdown rows of the step table and of the memory table."""
    steps, mem = [], []
    for name, rec in bench.get("models", {}).items():
        label = f"{name} ({rec['params'] / 1e6:.0f}M)" if "params" in rec else name
        if "error" in rec:
            steps.append(f"| {label} | | error: {rec['error'].splitlines()[0][:200]} | | | | | | | |")
        for s in rec.get("steps", []):
            if "step_s" not in s:
                steps.append(f"| {label} | {s['tokens']} | {s['skipped']} | | | | | | | |")
                continue
            ph = s["phases_s"]
            steps.append(
                f"| {label} | {s['tokens']} | {_ms(s['step_s'])} | {_ms(ph['values'])} | {_ms(ph['actor'])} | "
                f"{_ms(ph['critic'])} | {_ms(ph['other'])} | {s['tokens_per_s']:,.0f} | {s['mfu']:.3f} | "
                f"{_gib(s['peak_bytes'])} |"
            )
        for m in rec.get("logprob_memory", []):
            mem.append(
                f"| {label} | {m['tokens']} | {_gib(m['naive'])} | {_gib(m['chunked'])} | {_gib(m['backbone'])} |"
            )
    return steps, mem


def log_tail(path: Path, n: int = 8) -> list[str]:
    """The last ``n`` non-empty lines of a part's log (what the device tool's output tail should show of a failure)."""
    if not path.is_file():
        return []
    return [x for x in path.read_text(errors="replace").splitlines() if x.strip()][-n:]


def render(
    parts: dict[str, dict[str, Any]],
    bench: dict[str, Any],
    cases: list[dict[str, str]],
    tails: dict[str, list[str]] | None = None,
) -> str:
    """The report as markdown; ``tails``: the end of the log of each part that did not exit 0."""
    lines = [f"# GPU check ({bench.get('mode', '?')}: {bench.get('device', '?')})", ""]
    v = bench.get("versions", {})
    if v:
        lines += [", ".join(f"{k} {x}" for k, x in v.items()), ""]
    lines += ["| part | exit | seconds |", "|---|---|---|"]
    for name, p in parts.items():
        rc = "not run" if p["rc"] is None else ("timed out" if p["rc"] in TIMEOUT_RCS else str(p["rc"]))
        lines.append(f"| {name} | {rc} | {p['seconds']:.0f} |")
    for name, tail in (tails or {}).items():
        lines += ["", f"{name}.log ends:", "", "```", *tail, "```"]
    lines += ["", "| test | outcome | message |", "|---|---|---|"]
    lines += [f"| {c['test']} | {c['outcome']} | {c['message']} |" for c in cases] or ["| (no test results) | | |"]
    if "matmul" in bench:
        mm = bench["matmul"]
        lines += ["", f"bf16 matmul {mm['n']}x{mm['n']}x{mm['n']} (mean of {mm['iters']}): {mm['tflops']:.3g} TFLOP/s"]
    steps, mem = _model_rows(bench)
    k = bench.get("critic_updates_per_step", 2)
    lines += [
        "",
        f"One SAO step (bf16, ZeRO 0, one sequence; phase times in ms; critic = K={k} steps, frozen attention):",
        "",
        "| model | tokens | step | critic values | actor step | critic steps | other | tokens/s | MFU | peak GiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *steps,
        "",
        "Peak memory above the weights of one actor forward + backward, GiB:",
        "",
        "| model | tokens | full-vocabulary logprobs | chunked logprobs | no LM head |",
        "|---|---|---|---|---|",
        *mem,
        "",
        "| model | optimizer | critic head dtype before -> after deepspeed.initialize | critic values bf16-rounded |",
        "|---|---|---|---|",
    ]
    for name, rec in bench.get("models", {}).items():
        opt = rec.get("optimizer", "?") + (f" ({rec['optimizer_error'][:120]})" if "optimizer_error" in rec else "")
        dtypes = f"{rec.get('critic_head_dtype_before', '?')} -> {rec.get('critic_head_dtype', '?')}"
        rounded = {True: "yes (the head computes in bf16)", False: "no"}.get(rec.get("critic_values_bf16_rounded"), "?")
        lines.append(f"| {name} | {opt} | {dtypes} | {rounded} |")
    return "\n".join(lines) + "\n"


def ok(parts: dict[str, dict[str, Any]], bench: dict[str, Any], cases: list[dict[str, str]]) -> bool:
    parts_ok = all(p["rc"] in (0, None) for p in parts.values())
    tests_ok = not any(c["outcome"] in ("failed", "error") for c in cases)
    models = bench.get("models", {})
    bench_ok = bool(models) and all(
        "error" not in r and len(r["steps"]) == len(bench["lengths"]) and all("step_s" in s for s in r["steps"])
        for r in models.values()
    )
    return parts_ok and tests_ok and bench_ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parts", default="", help="name=rc:seconds for each part the script ran")
    a = ap.parse_args(argv)
    parts = parse_parts(a.parts)
    bench_path = a.out / "bench.json"
    bench: dict[str, Any] = json.loads(bench_path.read_text()) if bench_path.is_file() else {}
    cases = junit_cases(a.out / "tests.xml")
    good = ok(parts, bench, cases)
    tails = {n: log_tail(a.out / f"{n}.log") for n, p in parts.items() if p["rc"] not in (0, None)}
    text = render(parts, bench, cases, tails)
    write_text_durably(a.out / "gpu_check.md", text)
    summary = {"ok": good, "parts": parts, "tests": cases, "bench": bench}
    write_text_durably(a.out / "gpu_check.json", json.dumps(summary, indent=2))
    print(text)
    print(f"gpu check: {'OK' if good else 'NOT OK'} (table and logs in {a.out})")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
