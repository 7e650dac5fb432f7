"""Grade a patch on a SWE-bench-format instance the way the official harness does, in a fresh confined sandbox.

Steps (mirroring ``swebench.harness.run_evaluation.run_instance``): a fresh sandbox of the instance image, the patch
applied with the harness's ``git apply`` / ``patch`` fallbacks, the spec's eval script run, the log graded with
``swebench.harness.grading.get_eval_report``.

The patch's code runs here (pytest imports it) on every reward, so the grader is confined like the agent's own
sandbox: it is made by the sandbox layer (``make_sandbox``) from the env's ``SandboxConfig`` (``grader_sandbox``):
no network, every capability dropped, ``no-new-privileges``, the pids limit, the disk bound, CPU and memory of
that config, and the patch is applied and the eval script run as its unprivileged user (uid 1000 by default,
``HOME`` its own). Root does only the sandbox's own start, before anything of the patch exists in the container:
it makes ``/testbed`` the user's (the eval script runs git there) and, in images made elsewhere, the conda env
``testbed`` (``CONDA_ENV``: SWE-bench eval scripts reinstall the package into it). Out of the patch's reach: the
patch is first cut to source by ``sao.envs.swe.patch_policy`` (what was dropped is in ``GradeResult.dropped``), the
eval script is root's (written by root before the patch exists, readable and not writable by the user), and the
log is the run's output stream read by the daemon (``read_limit_bytes`` bounds it), no file the patch could rewrite;
what the patch's processes print is in it, as in the harness. Differences from the harness on purpose: no network
(the harness gives bridge networking and SYS_ADMIN) and no root.

Whose failure is it: whatever the patch can cause (the eval run times out, a fork bomb fills the pids limit until
the timeout, a process is killed for memory, the files written pass the disk bound, the container dies, the log is
too big, the patch itself is over the disk bound) is an unresolved grade, with ``extra["failure"]`` and
``extra["reason"]`` saying what happened. Only what the patch cannot cause (the daemon unreachable, the image
missing, the container removed from outside, the sandbox failing before the patch existed in it) raises
``GradingInfraError``, so callers can tell "the infrastructure broke" from "the patch is wrong".
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sao.envs.swe.patch_policy import apply_policy
from sao.sandboxes.backend import make_sandbox
from sao.sandboxes.config import SandboxConfig
from sao.sandboxes.protocols import ImageNotFoundError, RootCommands, Sandbox, SandboxDiedError, SandboxError

REPO_DIR = "/testbed"
# Our images keep deps in /opt/venv, official SWE-bench images in the conda env "testbed": both go first on PATH.
PATH = (
    "/opt/venv/bin:/opt/miniconda3/envs/testbed/bin:/opt/miniconda3/bin:"
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)
CONDA_ENV = "/opt/miniconda3/envs/testbed"
# An eval runs one pytest (a few dozen processes at most); 512 leaves room and keeps 32 graders under 16,384 pids.
GRADER_PIDS = 512
PATCH_PATH = "/tmp/sao_grade.diff"
GRADER_DIR = "/var/lib/sao-grader"  # root's, mode 0755: the eval script there is readable, never writable, by the patch
EVAL_PATH = f"{GRADER_DIR}/eval.sh"
# Root writes the eval script before anything of the patch exists in the container.
_WRITE_EVAL = f"mkdir -p -m 755 {GRADER_DIR} && cat > {EVAL_PATH} && chmod 644 {EVAL_PATH}"
# After the eval script, every process the patch left behind (holding the output open) is killed; this shell, the
# sandbox's wrapper and its `timeout` stay to report the exit status and the memory killer's count.
_RUN_EVAL = (
    f"/bin/bash {EVAL_PATH} 2>&1; rc=$?; keep=\" $$ $PPID $(cut -d' ' -f4 /proc/$PPID/stat) \"; "
    'for d in /proc/[0-9]*; do case "$keep" in *" ${d#/proc/} "*) ;; *) kill -9 "${d#/proc/}" 2>/dev/null;; esac; '
    "done; exit $rc"
)
APPLY_CMDS = (
    f"git apply --verbose {PATCH_PATH}",
    f"git apply --verbose --3way {PATCH_PATH}",
    f"patch --batch --forward --fuzz=5 -p1 -i {PATCH_PATH}",
)
APPLY_TIMEOUT_S = 120.0


class GradingInfraError(RuntimeError):
    """Docker or the image failed while grading: an infrastructure error, never a verdict on the patch."""


@dataclass(frozen=True)
class GradeResult:
    """``extra``: ``{"failure": kind, "reason": text}`` when the patch's run ended badly (kinds: ``timeout``,
    ``oom``, ``disk_full``, ``sandbox_died``, ``log_too_big``, ``patch_too_big``), else empty. ``dropped``: the
    paths the patch policy kept from the grader, with the reason (``sao.envs.swe.patch_policy``); ``signals``: the
    kept patch's added lines that may tamper with the test run (a detector, not part of the verdict)."""

    resolved: bool
    report: dict[str, Any]
    log: str = ""
    seconds: float = 0.0
    applied: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    dropped: tuple[dict[str, str], ...] = ()
    signals: tuple[str, ...] = ()


def default_sandbox() -> SandboxConfig:
    """The limits a SWE episode's sandbox and its grader get unless the env's config says otherwise."""
    return SandboxConfig(backend="docker", mem_limit="4g", cpus=2.0, pids_limit=GRADER_PIDS)


def grader_sandbox(cfg: SandboxConfig | None, image: str) -> SandboxConfig:
    """The grader's sandbox: ``cfg``'s limits and user (``default_sandbox()`` when ``None``) on ``image``, with
    ``/testbed`` as the working directory and the conda env of an official image the user's too. The eval's output
    (the log) comes back through the exec's stream, kept whole up to ``read_limit_bytes``."""
    cfg = cfg or default_sandbox()
    if cfg.backend != "docker":
        raise ValueError(f"the SWE grader needs sandbox.backend='docker' (instances are images), got {cfg.backend!r}")
    return dataclasses.replace(
        cfg,
        image=image,
        workdir=REPO_DIR,
        env={"PATH": PATH, **cfg.env},
        output_cap_bytes=max(cfg.output_cap_bytes, cfg.read_limit_bytes),
        owned_paths=tuple(dict.fromkeys((*cfg.owned_paths, CONDA_ENV))),
    )


def _failure(kind: str, reason: str) -> dict[str, Any]:
    return {"failure": kind, "reason": reason}


async def _apply(sb: Sandbox, patch: str) -> tuple[bool, str, dict[str, Any]]:
    """(applied, the last attempt's log, failure): the harness's commands in turn, the tree reset between them."""
    try:
        await sb.write_file(PATCH_PATH, patch if patch.endswith("\n") else patch + "\n")
    except OSError as e:  # as the user, under the disk bound: a patch over it is the policy's
        if e.errno in (errno.EFBIG, errno.ENOSPC):
            return False, str(e), _failure("patch_too_big", f"the patch is over the sandbox's disk limit: {e}")
        raise SandboxError(f"could not copy the patch into the grading sandbox: {e}") from e
    apply_log = ""
    for i, cmd in enumerate(APPLY_CMDS):
        if i:
            await sb.exec("git checkout -- . && git clean -fdq", timeout=60)
        res = await sb.exec(cmd, timeout=APPLY_TIMEOUT_S)
        apply_log = res.output
        if res.exit_code == 0:
            return True, apply_log, {}
    return False, apply_log, {}


def _run_failure(res: Any, timeout: float, cfg: SandboxConfig) -> dict[str, Any]:
    """What ended the eval run badly, from its ``ExecResult``; ``{}`` when it ended on its own."""
    if res.timed_out:
        return _failure("timeout", f"the eval script ran past its timeout of {timeout:g} s and was killed")
    if res.oom_killed:
        return _failure("oom", f"a process of the eval run was killed for memory (sandbox.mem_limit {cfg.mem_bytes} B)")
    if res.disk_full:
        return _failure(
            "disk_full", f"the files written during the eval run passed sandbox.disk_limit ({cfg.disk_bytes} B)"
        )
    return {}


async def _run_eval(sb: Sandbox, timeout: float, cfg: SandboxConfig) -> tuple[str, dict[str, Any]]:
    """(the log, failure) of the eval script run as the sandbox's user. The log is the run's output stream, read by
    the daemon: no file in the container holds it, so nothing of the patch can rewrite it after the run."""
    try:
        res = await sb.exec(_RUN_EVAL, timeout=timeout)
    except SandboxDiedError as e:
        return "", _failure("sandbox_died", f"the grading sandbox died during the eval run: {e}")
    failure = _run_failure(res, timeout, cfg)
    if res.truncated and not failure:
        failure = _failure("log_too_big", f"the eval log is over sandbox.read_limit_bytes ({cfg.read_limit_bytes} B)")
    log = res.output
    if res.timed_out and ">>>>> End Test Output" not in log:
        log += f"\n\nTimeout error: {timeout} seconds exceeded."  # what the harness writes on a timeout
    return log, failure


def _report(spec: Any, pred: dict[str, Any], log: str) -> dict[str, Any]:
    from swebench.harness.grading import get_eval_report

    with tempfile.TemporaryDirectory(prefix="sao-grade-") as tmp:
        log_path = Path(tmp) / "test_output.txt"
        log_path.write_text(log)
        report: dict[str, Any] = get_eval_report(
            test_spec=spec, prediction=pred, test_log_path=str(log_path), include_tests_status=True
        )
    return report


async def _grade_in(sb: Sandbox, spec: Any, pred: dict[str, Any], cfg: SandboxConfig, timeout: float) -> GradeResult:
    iid = spec.instance_id
    t0 = time.monotonic()
    # before the patch is in the container: a refusal here is not the patch's doing
    if not isinstance(sb, RootCommands):
        raise SandboxError(f"the grading sandbox {type(sb).__name__} cannot run root's steps (exec_as_root)")
    code, out = await sb.exec_as_root(["sh", "-c", _WRITE_EVAL], stdin=spec.eval_script.encode())
    if code != 0:
        raise SandboxError(f"could not write the eval script into the grading sandbox (exit {code}): {out[-300:]}")
    applied, apply_log, failure = await _apply(sb, pred["model_patch"])
    if not applied:
        head = {"patch_is_None": False, "patch_exists": True, "patch_successfully_applied": False, "resolved": False}
        report = {iid: head}
        return GradeResult(False, report, log=apply_log, seconds=time.monotonic() - t0, applied=False, extra=failure)
    log, failure = await _run_eval(sb, timeout, cfg)
    report = _report(spec, pred, log)
    resolved = bool(report[iid]["resolved"]) and not failure
    return GradeResult(resolved, report, log=log, seconds=time.monotonic() - t0, extra=failure)


async def grade_patch_async(
    instance: dict[str, Any], patch: str, *, timeout: float = 1800, sandbox: SandboxConfig | None = None
) -> GradeResult:
    """Apply ``patch`` in a fresh confined sandbox of ``instance["image"]`` (limits and daemon from ``sandbox``, see
    ``grader_sandbox``), run its eval script, grade the log. ``GradingInfraError`` only for infrastructure failures."""
    from swebench.harness.utils import make_test_spec

    from sao.envs.swe.tasks.instance import validate_instance

    validate_instance(instance)
    spec = make_test_spec(instance)
    iid = spec.instance_id
    policy = apply_policy(patch)  # only source reaches the grader
    dropped, signals = tuple(policy.report()), policy.signals
    pred = {"instance_id": iid, "model_name_or_path": "sao", "model_patch": policy.patch}
    if not policy.patch.strip():
        # The harness skips empty predictions as unresolved without starting a container; so do we.
        report = {iid: {"patch_is_None": False, "patch_exists": False, "resolved": False, "empty_patch": True}}
        return GradeResult(False, report, applied=False, dropped=dropped, signals=signals)
    cfg = grader_sandbox(sandbox, spec.image)
    t0 = time.monotonic()
    try:
        sb = await make_sandbox(cfg)
    except ImageNotFoundError as e:
        raise GradingInfraError(
            f"image {spec.image} of task {iid} is not present; build it (`sao tasks build`, or "
            "`sao.envs.swe.tasks.ensure_task_images`) or pull it from a reachable registry"
        ) from e
    except SandboxError as e:
        raise GradingInfraError(f"could not start the grading sandbox of {iid}: {e}") from e
    try:
        result = await _grade_in(sb, spec, pred, cfg, timeout)
    except SandboxDiedError as e:  # while applying: only the patch's doing can stop the container then
        report = {iid: {"patch_is_None": False, "patch_exists": True, "resolved": False}}
        died = _failure("sandbox_died", f"the grading sandbox died: {e}")
        seconds = time.monotonic() - t0
        return GradeResult(False, report, seconds=seconds, applied=False, extra=died, dropped=dropped, signals=signals)
    except SandboxError as e:
        raise GradingInfraError(f"the grading sandbox of {iid} failed: {e}") from e
    finally:
        try:
            await sb.close()
        except SandboxError:  # the verdict stands; a container left behind is reaped with its owner
            pass
    return dataclasses.replace(result, seconds=time.monotonic() - t0, dropped=dropped, signals=signals)


def grade_patch(
    instance: dict[str, Any], patch: str, *, timeout: float = 1800, sandbox: SandboxConfig | None = None
) -> GradeResult:
    """``grade_patch_async`` for synchronous callers (the task builder, scripts); from async code await that."""
    return asyncio.run(grade_patch_async(instance, patch, timeout=timeout, sandbox=sandbox))
