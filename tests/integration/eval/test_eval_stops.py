"""`sao eval swebench` as a user runs it, in a subprocess of the console entry: SIGTERM (what `kill`, a scheduler or
a CI timeout sends) stops it cleanly, with no container of it left behind, long before its episode would end."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import cli_env

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[3]
SLEEP_S = 150  # the scripted episode's command: far longer than a clean stop may take


def _containers_of(client: Any, pid: int) -> list[Any]:
    from sao.sandboxes.docker import OWNER_PID_LABEL

    return list(client.containers.list(all=True, filters={"label": f"{OWNER_PID_LABEL}={pid}"}))


def test_sigterm_removes_the_eval_containers_before_it_exits(
    eval_tasks: list[dict[str, Any]], docker_client: Any, tmp_path: Path
) -> None:
    task = eval_tasks[0]
    dataset = tmp_path / "tasks.jsonl"
    dataset.write_text(json.dumps(task) + "\n")
    call = json.dumps({"name": "bash", "arguments": {"command": f"sleep {SLEEP_S}"}})
    script = tmp_path / "sleep.jsonl"
    script.write_text(json.dumps({"id": task["instance_id"], "actions": [f"<tool_call>{call}</tool_call>"]}) + "\n")
    cmd = [
        sys.executable, "-m", "sao.cli.main", "eval", "swebench", "--model", f"scripted:{script}",
        "--dataset", str(dataset), "--out", str(tmp_path / "out"), "--workers", "1", "--max-steps", "3",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        # the episode's container runs its command once `sleep` shows in it (the env's setup commands are done)
        while time.monotonic() < deadline and proc.poll() is None:
            running = [c for c in _containers_of(docker_client, proc.pid) if c.status == "running"]
            if any("sleep" in " ".join(p[-1] for p in c.top()["Processes"]) for c in running):
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no container of the eval ran its command within 180 s"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        stop_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    left = _containers_of(docker_client, proc.pid)
    for c in left:
        c.remove(force=True)
    assert not left, f"{len(left)} container(s) of the stopped eval left behind; stderr: {err[-2000:]}"
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert stop_s < SLEEP_S / 2, f"the stop took {stop_s:.0f} s: it waited for the episode instead of ending it"
    print(f"SIGTERM to exit: {stop_s:.1f} s")


# grade_with_harness in a process the test SIGKILLs once the official harness runs; the patch is the gold fix with a
# sleep before its first added line (source, so the patch policy keeps it), so the harness's test run outlasts the test
# unless something stops it


def slow_patch(gold: str) -> str:
    lines = gold.splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if ln.startswith("+") and not ln.startswith("+++"))
    indent = lines[at][1 : len(lines[at]) - len(lines[at][1:].lstrip())]
    lines.insert(at, f'+{indent}__import__("time").sleep(600)\n')
    hunk = max(i for i in range(at) if lines[i].startswith("@@"))
    head, _, rest = lines[hunk].partition(" +")
    new_start, _, tail = rest.partition(" @@")
    start, _, count = new_start.partition(",")
    lines[hunk] = f"{head} +{start},{int(count or 1) + 1} @@{tail}"
    return "".join(lines)


HARNESS_LAUNCHER = """
import json, sys
from pathlib import Path
from sao.eval.harness import grade_with_harness
rec = json.loads(Path(sys.argv[1]).read_text())
pred = {"instance_id": rec["instance_id"], "model_name_or_path": "tether-check", "model_patch": sys.argv[3]}
grade_with_harness([pred], [rec], Path(sys.argv[2]), workers=1)
"""


def _harness_pids(workdir: Path) -> list[int]:
    """Live processes of the official harness run in ``workdir`` (its dataset file is in their argv)."""
    mark = str(workdir / "dataset.jsonl").encode()
    found = []
    for d in Path("/proc").iterdir():
        try:
            args = (d / "cmdline").read_bytes().split(b"\0")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, ValueError, IndexError):
            continue
        if mark in args and b"swebench.harness.run_evaluation" in args and state != "Z":
            found.append(int(d.name))
    return found


def test_the_official_harness_dies_with_an_eval_killed_by_sigkill(
    eval_tasks: list[dict[str, Any]], docker_client: Any, tmp_path: Path
) -> None:
    rec = tmp_path / "rec.json"
    rec.write_text(json.dumps(eval_tasks[0]))
    workdir = (tmp_path / "harness").resolve()
    run = [sys.executable, "-c", HARNESS_LAUNCHER, str(rec), str(workdir), slow_patch(eval_tasks[0]["patch"])]
    proc = subprocess.Popen(run, cwd=ROOT, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and not _harness_pids(workdir):
            time.sleep(0.2)
        assert proc.poll() is None and _harness_pids(workdir), "the harness did not start within 120 s"
        proc.kill()  # SIGKILL: the eval runs no cleanup of its own
        proc.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _harness_pids(workdir):
            time.sleep(0.2)
        left = _harness_pids(workdir)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        # what the killed harness left of its grading (its containers are named sweb.eval.<instance>.<run id>)
        named = f"sweb.eval.{eval_tasks[0]['instance_id']}."
        for c in docker_client.containers.list(all=True, filters={"name": named}):
            c.remove(force=True)
    assert not left, f"the official harness outlived the eval that started it: pids {left}"
    assert not list(workdir.rglob("report.json")), "the harness finished its grading: the kill was not what ended it"
