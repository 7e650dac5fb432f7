"""Whose failure is it, in the SWE grader: what the patch's run can cause is a reason on an unresolved grade, never an
exception (the Docker side of the same cases: tests/integration/swe/test_hostile_patches.py)."""

from __future__ import annotations

import asyncio
import errno
from typing import Any

import pytest

import sao.envs.swe.grading as grading
from sao.envs.swe.grading import EVAL_PATH, GradingInfraError, _apply, _run_eval, grade_patch, grader_sandbox
from sao.envs.swe.tasks.instance import eval_script
from sao.sandboxes.config import SandboxConfig
from sao.sandboxes.protocols import ExecResult, ImageNotFoundError, SandboxDiedError, SandboxError

CFG = SandboxConfig(mem_limit="512m", disk_limit="256m")
LOG = ">>>>> Start Test Output\nPASSED t.py::test_a\n>>>>> End Test Output\n"


class ScriptedSandbox:
    """Answers ``exec`` with the next of ``results`` (an ``ExecResult`` or an exception to raise); ``write_file``
    raises ``write_error`` when given and keeps what it wrote; ``exec_as_root`` exits ``root_exit``."""

    def __init__(self, results: list[Any], write_error: OSError | None = None, root_exit: int = 0) -> None:
        self.results, self.write_error, self.root_exit = list(results), write_error, root_exit
        self.commands: list[str] = []
        self.written: dict[str, str] = {}
        self.root_stdin = b""

    async def exec(self, cmd: str, timeout: float = 60.0, **_: Any) -> ExecResult:
        self.commands.append(cmd)
        result = self.results.pop(0)
        if isinstance(result, BaseException):
            raise result
        return result  # type: ignore[no-any-return]

    async def exec_as_root(self, argv: list[str], timeout: float = 120.0, stdin: bytes = b"") -> tuple[int, str]:
        assert EVAL_PATH in argv[-1]
        self.root_stdin = stdin
        return self.root_exit, ""

    async def write_file(self, path: str, content: str) -> None:
        if self.write_error is not None:
            raise self.write_error
        self.written[path] = content

    async def close(self) -> None:
        self.closed = True


def run_eval(sb: ScriptedSandbox, timeout: float = 30) -> tuple[str, dict[str, Any]]:
    return asyncio.run(_run_eval(sb, timeout, CFG))  # type: ignore[arg-type]


def test_an_eval_run_that_ends_on_its_own_has_no_failure() -> None:
    assert run_eval(ScriptedSandbox([ExecResult(0, LOG)])) == (LOG, {})
    assert run_eval(ScriptedSandbox([ExecResult(1, LOG)])) == (LOG, {})  # failing tests are a verdict, not a fault


@pytest.mark.parametrize(
    ("result", "kind", "said"),
    [
        (ExecResult(124, "partial", timed_out=True), "timeout", "30 s"),
        (ExecResult(137, "partial", oom_killed=True), "oom", "mem_limit"),
        (ExecResult(137, "partial", disk_full=True), "disk_full", "disk_limit"),
    ],
)
def test_what_ended_the_eval_run_is_the_reason(result: ExecResult, kind: str, said: str) -> None:
    log, failure = run_eval(ScriptedSandbox([result]))
    assert failure["failure"] == kind and said in failure["reason"]
    assert log.endswith("Timeout error: 30 seconds exceeded.") == (kind == "timeout")  # as the harness writes it


def test_a_dying_container_or_a_huge_log_are_the_patchs() -> None:
    died = run_eval(ScriptedSandbox([SandboxDiedError("status=exited")]))
    assert (
        died == ("", {"failure": "sandbox_died", "reason": died[1]["reason"]}) and "status=exited" in died[1]["reason"]
    )
    huge = run_eval(ScriptedSandbox([ExecResult(0, LOG, truncated=True)]))
    assert huge[1]["failure"] == "log_too_big" and "read_limit_bytes" in huge[1]["reason"]
    # a timeout and its cut log: the timeout is the reason
    both = run_eval(ScriptedSandbox([ExecResult(124, "", timed_out=True, truncated=True)]))
    assert both[1]["failure"] == "timeout"


def test_the_log_is_the_runs_output_and_the_eval_script_roots() -> None:
    """No file of the grader is the patch's: the log comes back on the exec's stream (nothing to rewrite after the
    run) and the eval script is written by root before the patch is applied."""
    sb, spec = ScriptedSandbox([ExecResult(0, ""), ExecResult(0, LOG)]), _spec()
    pred = {"model_patch": PATCH, "instance_id": "pkg-1"}
    graded = asyncio.run(grading._grade_in(sb, spec, pred, CFG, 30))  # type: ignore[arg-type]
    assert graded.resolved and graded.log == LOG
    assert sb.root_stdin == spec.eval_script.encode() and list(sb.written) == [grading.PATCH_PATH]
    assert sb.commands[-1].startswith(f"/bin/bash {EVAL_PATH} 2>&1;")  # no redirection into a file
    assert grader_sandbox(CFG, "img").output_cap_bytes == CFG.read_limit_bytes


def test_a_patch_over_the_disk_bound_is_not_applied_and_says_why() -> None:
    sb = ScriptedSandbox([], write_error=OSError(errno.EFBIG, "File too large"))
    applied, _, failure = asyncio.run(_apply(sb, "diff --git a/x b/x\n"))  # type: ignore[arg-type]
    assert not applied and failure["failure"] == "patch_too_big" and not sb.commands


def test_the_grader_takes_the_envs_limits_and_user() -> None:
    env_cfg = SandboxConfig(mem_limit="2g", cpus=1.5, pids_limit=99, disk_limit="300m", env={"A": "1"})
    cfg = grader_sandbox(env_cfg, "sao-swe-x:1")
    assert (cfg.image, cfg.workdir, cfg.user) == ("sao-swe-x:1", "/testbed", "1000:1000")
    assert (cfg.mem_bytes, cfg.cpus, cfg.pids_limit, cfg.disk_bytes) == (2 << 30, 1.5, 99, 300 << 20)
    assert cfg.env["A"] == "1" and cfg.env["PATH"].startswith("/opt/venv/bin:")
    assert "/opt/miniconda3/envs/testbed" in cfg.owned_paths
    with pytest.raises(ValueError, match="backend='docker'"):
        grader_sandbox(SandboxConfig(backend="bwrap"), "img")


TASK = {
    "instance_id": "pkg-1",
    "repo": "pypi/pkg",
    "version": "1",
    "base_commit": "0" * 40,
    "problem_statement": "t fails",
    "patch": "",
    "test_patch": "",
    "FAIL_TO_PASS": ["t.py::test_a"],
    "PASS_TO_PASS": [],
    "image": "sao-swe-pkg:1",
    "eval_script": eval_script("0" * 40, ["t.py"]),
    "log_parser": "parse_log_pytest",
    "eval_type": "pass_and_fail",
}
PATCH = "diff --git a/x.py b/x.py\nindex 1111111..2222222 100644\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
CONFTEST = (
    "diff --git a/conftest.py b/conftest.py\nnew file mode 100644\n--- /dev/null\n+++ b/conftest.py\n"
    "@@ -0,0 +1 @@\n+x\n"
)


def _spec() -> Any:
    from swebench.harness.utils import make_test_spec

    return make_test_spec(TASK)


def graded_by(monkeypatch: pytest.MonkeyPatch, sb: Any) -> Any:
    async def make(cfg: SandboxConfig) -> Any:
        if isinstance(sb, BaseException):
            raise sb
        return sb

    monkeypatch.setattr(grading, "make_sandbox", make)
    return grade_patch(TASK, PATCH, timeout=30, sandbox=CFG)


def test_a_fault_of_the_patchs_run_is_an_unresolved_grade_never_an_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    ok = ExecResult(0, LOG)
    resolved = graded_by(monkeypatch, ScriptedSandbox([ok, ok]))
    assert resolved.resolved and resolved.extra == {}
    sb = ScriptedSandbox([ok, ExecResult(124, LOG, timed_out=True)])
    timed_out = graded_by(monkeypatch, sb)  # the log says the test passed, but the run never ended
    assert not timed_out.resolved and timed_out.extra["failure"] == "timeout" and sb.closed
    died = graded_by(monkeypatch, ScriptedSandbox([SandboxDiedError("exited")]))  # while the patch was applied
    assert not died.resolved and died.extra["failure"] == "sandbox_died"


@pytest.mark.parametrize(
    "fault",
    [
        ImageNotFoundError("no such image"),
        SandboxError("the daemon cannot be reached"),
        ScriptedSandbox([SandboxError("container removed")]),
        ScriptedSandbox([ExecResult(0, ""), SandboxError("container removed")]),
        ScriptedSandbox([], root_exit=1),  # root could not write the eval script
    ],
)
def test_a_fault_of_the_infrastructure_is_a_grading_infra_error(monkeypatch: pytest.MonkeyPatch, fault: Any) -> None:
    with pytest.raises(GradingInfraError):
        graded_by(monkeypatch, fault)


def test_only_what_the_policy_keeps_reaches_the_grader(monkeypatch: pytest.MonkeyPatch) -> None:
    ok = ExecResult(0, LOG)
    sb = ScriptedSandbox([ok, ok])

    async def make(cfg: SandboxConfig) -> Any:
        return sb

    monkeypatch.setattr(grading, "make_sandbox", make)
    graded = grade_patch(TASK, CONFTEST + PATCH, timeout=30, sandbox=CFG)
    assert sb.written[grading.PATCH_PATH] == PATCH
    assert [d["path"] for d in graded.dropped] == ["conftest.py"] and graded.dropped[0]["kind"] == "conftest"
    # nothing left: unresolved without a container, and the report still says what was dropped
    monkeypatch.setattr(grading, "make_sandbox", None)
    only = grade_patch(TASK, CONFTEST, timeout=30, sandbox=CFG)
    assert not only.resolved and not only.applied and only.dropped == graded.dropped
