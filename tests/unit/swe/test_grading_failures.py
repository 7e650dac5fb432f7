"""Whose failure is it, in the SWE grader: what the patch's run can cause is a reason on an unresolved grade, never an
exception (the Docker side of the same cases: tests/integration/swe/test_hostile_patches.py)."""

from __future__ import annotations

import asyncio
import errno
from typing import Any

import pytest

import sao.envs.swe.grading as grading
from sao.envs.swe.grading import LOG_PATH, GradingInfraError, _apply, _run_eval, grade_patch, grader_sandbox
from sao.envs.swe.tasks.instance import eval_script
from sao.sandboxes.config import SandboxConfig
from sao.sandboxes.protocols import ExecResult, ImageNotFoundError, SandboxDiedError, SandboxError

CFG = SandboxConfig(mem_limit="512m", disk_limit="256m")
LOG = ">>>>> Start Test Output\nPASSED t.py::test_a\n>>>>> End Test Output\n"


class ScriptedSandbox:
    """Answers ``exec`` with the next of ``results`` (an ``ExecResult`` or an exception to raise) and ``read_file``
    with ``log`` (text, or an exception to raise); ``write_file`` raises ``write_error`` when given."""

    def __init__(self, results: list[Any], log: Any = LOG, write_error: OSError | None = None) -> None:
        self.results, self.log, self.write_error = list(results), log, write_error
        self.commands: list[str] = []

    async def exec(self, cmd: str, timeout: float = 60.0, **_: Any) -> ExecResult:
        self.commands.append(cmd)
        result = self.results.pop(0)
        if isinstance(result, BaseException):
            raise result
        return result  # type: ignore[no-any-return]

    async def read_file(self, path: str) -> str:
        assert path == LOG_PATH
        if isinstance(self.log, BaseException):
            raise self.log
        return str(self.log)

    async def write_file(self, path: str, content: str) -> None:
        if self.write_error is not None:
            raise self.write_error

    async def close(self) -> None:
        self.closed = True


def run_eval(sb: ScriptedSandbox, timeout: float = 30) -> tuple[str, dict[str, Any]]:
    return asyncio.run(_run_eval(sb, timeout, CFG))  # type: ignore[arg-type]


def test_an_eval_run_that_ends_on_its_own_has_no_failure() -> None:
    assert run_eval(ScriptedSandbox([ExecResult(0, "")])) == (LOG, {})
    assert run_eval(ScriptedSandbox([ExecResult(1, "")])) == (LOG, {})  # failing tests are a verdict, not a fault


@pytest.mark.parametrize(
    ("result", "kind", "said"),
    [
        (ExecResult(124, "", timed_out=True), "timeout", "30 s"),
        (ExecResult(137, "", oom_killed=True), "oom", "mem_limit"),
        (ExecResult(137, "", disk_full=True), "disk_full", "disk_limit"),
    ],
)
def test_what_ended_the_eval_run_is_the_reason(result: ExecResult, kind: str, said: str) -> None:
    log, failure = run_eval(ScriptedSandbox([result], log="partial"))
    assert failure["failure"] == kind and said in failure["reason"]
    assert log.endswith("Timeout error: 30 seconds exceeded.") == (kind == "timeout")  # as the harness writes it


def test_a_dying_container_a_missing_or_huge_log_are_the_patchs() -> None:
    died = run_eval(ScriptedSandbox([SandboxDiedError("status=exited")], log=SandboxDiedError("gone")))
    assert (
        died == ("", {"failure": "sandbox_died", "reason": died[1]["reason"]}) and "status=exited" in died[1]["reason"]
    )
    missing = run_eval(ScriptedSandbox([ExecResult(0, "")], log=FileNotFoundError(LOG_PATH)))
    assert missing[1]["failure"] == "log_missing"
    huge = run_eval(ScriptedSandbox([ExecResult(0, "")], log=OSError(errno.EFBIG, "over read_limit_bytes")))
    assert huge[1]["failure"] == "log_too_big"
    # a timeout and its lost log: the timeout is the reason
    both = run_eval(ScriptedSandbox([ExecResult(124, "", timed_out=True)], log=FileNotFoundError(LOG_PATH)))
    assert both[1]["failure"] == "timeout"


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
PATCH = "diff --git a/x b/x\n"


def graded_by(monkeypatch: pytest.MonkeyPatch, sb: Any) -> Any:
    async def make(cfg: SandboxConfig) -> Any:
        if isinstance(sb, BaseException):
            raise sb
        return sb

    monkeypatch.setattr(grading, "make_sandbox", make)
    return grade_patch(TASK, PATCH, timeout=30, sandbox=CFG)


def test_a_fault_of_the_patchs_run_is_an_unresolved_grade_never_an_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    ok = ExecResult(0, "")
    resolved = graded_by(monkeypatch, ScriptedSandbox([ok, ok]))
    assert resolved.resolved and resolved.extra == {}
    sb = ScriptedSandbox([ok, ExecResult(124, "", timed_out=True)])
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
        ScriptedSandbox([], write_error=OSError(errno.EIO, "the eval script could not be written")),
    ],
)
def test_a_fault_of_the_infrastructure_is_a_grading_infra_error(monkeypatch: pytest.MonkeyPatch, fault: Any) -> None:
    with pytest.raises(GradingInfraError):
        graded_by(monkeypatch, fault)
