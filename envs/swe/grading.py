"""Grade a patch on a SWE-bench-format instance the way the official harness does, in a fresh container.

Steps (mirroring ``swebench.harness.run_evaluation.run_instance``): start a container from the instance image,
apply the patch with the harness's ``git apply`` / ``patch`` fallbacks, run the spec's eval script, and grade the
log with ``swebench.harness.grading.get_eval_report``. Differences on purpose: the container has no network
(the harness gives bridge networking and SYS_ADMIN), and Docker failures raise ``GradingInfraError`` instead of
being logged, so callers can tell "the infrastructure broke" from "the patch is wrong".
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sao.sandboxes.docker import tar_one

APPLY_CMDS = (
    "git apply --verbose /tmp/patch.diff",
    "git apply --verbose --3way /tmp/patch.diff",
    "patch --batch --forward --fuzz=5 -p1 -i /tmp/patch.diff",
)


class GradingInfraError(RuntimeError):
    """Docker or the image failed while grading: an infrastructure error, never a verdict on the patch."""


@dataclass(frozen=True)
class GradeResult:
    resolved: bool
    report: dict[str, Any]
    log: str = ""
    seconds: float = 0.0
    applied: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


def _put(container: Any, path: str, text: str) -> None:
    archive = tar_one(os.path.basename(path), text.encode(), mode=0o755)
    if not container.put_archive(os.path.dirname(path), archive):
        raise GradingInfraError(f"could not copy {path} into the grading container")


def _exec(container: Any, cmd: str, timeout: float) -> tuple[int, str]:
    res = container.exec_run(["timeout", "-k", "5", str(int(timeout)), "bash", "-c", cmd], workdir="/testbed")
    return int(res.exit_code), res.output.decode(errors="replace")


def _start_container(client: Any, image: str, iid: str, mem_limit: str) -> Any:
    """A detached, networkless container of ``image`` (which must be present) that waits for our commands."""
    import docker

    try:
        client.images.get(image)
    except docker.errors.ImageNotFound as e:
        raise GradingInfraError(
            f"image {image} of task {iid} is not present; build it (`sao tasks build`, or "
            "`sao.envs.swe.tasks.ensure_task_images`) or pull it from a reachable registry"
        ) from e
    return client.containers.run(
        image,
        command=["sleep", "infinity"],
        detach=True,
        network_mode="none",
        mem_limit=mem_limit,
        labels={"sao.owner_pid": str(os.getpid()), "sao.role": "swe-grader"},
    )


def _apply(container: Any, patch: str) -> tuple[bool, str]:
    """(applied, the last attempt's log): the harness's commands in turn, the tree reset between attempts."""
    _put(container, "/tmp/patch.diff", patch if patch.endswith("\n") else patch + "\n")
    apply_log = ""
    for i, cmd in enumerate(APPLY_CMDS):
        if i:
            _exec(container, "git checkout -- . && git clean -fdq", 60)
        code, apply_log = _exec(container, cmd, 120)
        if code == 0:
            return True, apply_log
    return False, apply_log


def _run_eval(container: Any, spec: Any, pred: dict[str, Any], timeout: float) -> tuple[dict[str, Any], str]:
    """(the harness's report, the log) of the spec's eval script run in ``container``."""
    from swebench.harness.grading import get_eval_report

    _put(container, "/eval.sh", spec.eval_script)
    code, log = _exec(container, "/bin/bash /eval.sh", timeout)
    if code in (124, 137) and ">>>>> End Test Output" not in log:
        log += f"\n\nTimeout error: {timeout} seconds exceeded."
    with tempfile.TemporaryDirectory(prefix="sao-grade-") as tmp:
        log_path = Path(tmp) / "test_output.txt"
        log_path.write_text(log)
        report = get_eval_report(
            test_spec=spec, prediction=pred, test_log_path=str(log_path), include_tests_status=True
        )
    return report, log


def grade_patch(
    instance: dict[str, Any],
    patch: str,
    *,
    timeout: float = 1800,
    client: Any = None,
    docker_host: str | None = None,
    mem_limit: str = "4g",
) -> GradeResult:
    """Apply ``patch`` in a fresh container of ``instance["image"]``, run its eval script, grade the log.
    The Docker daemon is ``client``, else ``docker_host``, else the environment's (``DOCKER_HOST``)."""
    import docker
    from swebench.harness.utils import make_test_spec

    from sao.envs.swe.tasks.instance import validate_instance

    validate_instance(instance)
    spec = make_test_spec(instance)
    iid = spec.instance_id
    pred = {"instance_id": iid, "model_name_or_path": "sao", "model_patch": patch}
    if not patch.strip():
        # The harness skips empty predictions as unresolved without starting a container; so do we.
        report = {iid: {"patch_is_None": False, "patch_exists": False, "resolved": False, "empty_patch": True}}
        return GradeResult(False, report, applied=False)
    t0 = time.monotonic()
    container = None
    own_client = client is None
    try:
        if client is None:
            t = int(timeout) + 60
            client = docker.DockerClient(base_url=docker_host, timeout=t) if docker_host else docker.from_env(timeout=t)
        container = _start_container(client, spec.image, iid, mem_limit)
        applied, apply_log = _apply(container, patch)
        if not applied:
            report = {
                iid: {
                    "patch_is_None": False,
                    "patch_exists": True,
                    "patch_successfully_applied": False,
                    "resolved": False,
                }
            }
            return GradeResult(False, report, log=apply_log, seconds=time.monotonic() - t0, applied=False)
        report, log = _run_eval(container, spec, pred, timeout)
        return GradeResult(bool(report[iid]["resolved"]), report, log=log, seconds=time.monotonic() - t0)
    except GradingInfraError:
        raise
    except docker.errors.DockerException as e:
        raise GradingInfraError(f"Docker failed while grading {iid}: {e}") from e
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except Exception:  # best effort: the container may already be gone
                pass
        if own_client and client is not None:
            client.close()
