"""``SWEEnv`` (``sao/SWE-v0``): repair a repository from a SWE-bench-format instance; graded by the swebench harness.

An episode: a DockerSandbox (no network) from the instance's image, the repo at ``/testbed``; the user message is
the problem statement; the tools are ``bash``, ``str_replace_editor`` and ``submit``. On ``submit`` (or when a
limit ends the episode) the env takes the repo's changes against the base it kept at setup, with a git the agent
cannot configure (``sao.envs.swe.repo_patch``: what is graded is what is on disk; new files included), cuts the
patch to source (``sao.envs.swe.patch_policy``: tests, conftest, test config, start-up hooks, plugins and the like
are dropped, listed in ``info["report"]["dropped_paths"]``), runs the instance's eval script in a FRESH sandbox from
the same image with that patch applied, confined by the env's own sandbox config
(``sao.envs.swe.grading.grade_patch_async``: unprivileged user, pids, disk, CPU and memory limits, no network) and
grades the log with ``swebench.harness.grading.get_eval_report``.
Reward 1.0 if resolved else 0.0; ``info["report"]`` is the swebench report of the instance plus the graded patch,
and ``failure`` / ``reason`` when the patch's run ended badly (timeout, fork bomb, memory, disk: a scored failure)
or the agent left a working tree git cannot read (``broken_repo``: reward 0, never an infra error; a deleted
``.git``, a stale lock or a rewritten HEAD change nothing, the base is the env's own). A Docker failure (sandbox or
grader) ends the episode with ``info["infra_error"]``, never a reward of 0.

No reachable fix: our offline task images hold a one-commit repository and no copy of the package's original source
(``sao.envs.swe.tasks.images``; ``tests/integration/swe/test_task_integrity.py`` audits every image the builder makes).
Images made elsewhere (the official SWE-bench ones) may keep history past ``base_commit``: images built by older
harness versions keep the whole clone (later commits reachable from tags, remote refs and the reflog, the fix among
them); the current harness deletes later tags, expires the reflog and prunes. So for any image not built here,
``setup`` remakes ``/testbed``'s repository in the agent's container from its tracked files at ``base_commit``: one
commit, no refs, no reflog, no other objects (the history before ``base_commit`` goes too; ``git log`` shows one
commit). The grader uses a fresh container of the unchanged image, so ``base_commit`` is there for the eval script.
No official image could be pulled where this was built (no registry): the remake is tested on a local image laid out
like the old ones (the fix reachable from a tag, a remote-tracking ref and the reflog).
Exposures found and closed in our images: two commits (``git diff HEAD~1`` showed the bug), the fixed blob in the
object store, the package's own wheel in ``/wheels``, a near-identical copy vendored by pip (``pip/_vendor/six.py``
in six tasks: vendored copies of the package's top-level modules are deleted, which leaves pip unusable in those
images; there is no network to use it anyway) and pip/setuptools wheels bundling them. Exposures that remain:
an official image is not changed beyond its repository (its environment may hold other copies); the problem
statement names the failing tests and their errors; the test files are in the repo (restored from ``base_commit``
before grading, so editing them changes nothing, but reading them shows the expected behaviour, as in SWE-bench);
library code runs inside the grader's pytest, so a source change could still tamper with pytest itself or print
forged results when imported (the reward is only as strong as the test run; nothing here detects that). The
hostile-policy suite for the reward is ``tests/integration/swe/test_hostile_rewards.py``.

Sized for small contexts: a tool result longer than ``max_obs_lines`` lines keeps its first and last lines around
a visible ``... N lines omitted ...`` line, and lines longer than ``max_line_chars`` are cut the same way
(``cut_lines``). With ``pass_to_pass_sample=N`` the reward runs only the instance's FAIL_TO_PASS tests and N of its
PASS_TO_PASS tests, drawn per episode from the env's seeded generator (offline SAO tasks only; a faster reward for
training: ``info["report"]["pass_to_pass_sampled"]`` says so); ``None`` (the default) grades as the official
harness does, on every test.

Tasks: ``reset(options={"task": record})`` or drawn by seed from ``tasks`` (a JSONL/JSON path or a list of
records). Records are validated up front (``ValueError`` naming the field). Our offline tasks come from
``sao tasks build`` / ``sao.envs.swe.tasks.ensure_offline_tasks``; official SWE-bench Verified records name their
published images, which are pulled when missing and a registry is reachable.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import shlex
from pathlib import Path
from typing import Any

import numpy as np

from sao.envs.base import Grade, ToolEnv, Turn
from sao.envs.protocols import Tool
from sao.envs.swe.grading import PATH, REPO_DIR, GradingInfraError, default_sandbox, grade_patch_async
from sao.envs.swe.repo_patch import BrokenRepoError, keep_base, take_patch
from sao.envs.tools.bash import BashTool
from sao.envs.tools.editor import EditorTool
from sao.envs.tools.submit import SubmitTool
from sao.sandboxes.config import SandboxConfig
from sao.sandboxes.protocols import ImageNotFoundError, Sandbox, SandboxError

OWN_IMAGE_PREFIX = "sao-swe-"
# Remakes the repo of an image made elsewhere from its tracked files (see the module docstring). $1: base_commit.
SCRUB_HISTORY = r"""set -eu
cd /testbed
[ -d .git ] || exit 0
list=$(mktemp)
git ls-files -z > "$list"
rm -rf .git
git init -q -b main .
GIT_LITERAL_PATHSPECS=1 git add -f --pathspec-from-file="$list" --pathspec-file-nul
rm -f "$list"
GIT_AUTHOR_DATE=2000-01-01T00:00:00Z GIT_COMMITTER_DATE=2000-01-01T00:00:00Z \
  git -c user.name=sao -c user.email=sao@localhost commit -q --allow-empty -m "base_commit $1"
rm -rf .git/logs
"""
SYSTEM_PROMPT = (
    "You are a software engineer fixing a bug in the repository at /testbed (a git repository; its Python "
    "environment is already on PATH, with no network access). Use the bash tool to explore and run tests and the "
    "str_replace_editor tool to edit files. Change library code, not the tests. When the fix is done, call submit; "
    "your working-tree changes (git diff) are what gets graded by running the project's tests."
)


def cut_lines(text: str, max_lines: int, max_line_chars: int) -> str:
    """``text`` with at most ``max_lines`` lines (its first and last lines around a ``... N lines omitted ...``
    line) and each line at most ``max_line_chars`` characters (head and tail around ``... N chars omitted ...``)."""
    lines = text.split("\n")
    if len(lines) > max_lines:
        head = (max_lines + 1) // 2
        tail = max_lines - head
        lines = [*lines[:head], f"... {len(lines) - head - tail} lines omitted ...", *lines[len(lines) - tail :]]
    out = []
    for line in lines:
        if len(line) > max_line_chars:
            keep = max_line_chars // 2
            line = f"{line[:keep]} ... {len(line) - 2 * keep} chars omitted ... {line[len(line) - keep :]}"
        out.append(line)
    return "\n".join(out)


class SWEEnv(ToolEnv):
    """One SWE-bench-format instance per episode in a Docker sandbox (see the module docstring)."""

    def __init__(
        self,
        tasks: str | Path | list[dict[str, Any]] | None = None,
        *,
        sandbox: SandboxConfig | dict[str, Any] | None = None,
        grade_timeout_s: float = 1800.0,
        tool_timeout_s: float = 180.0,
        max_steps: int = 50,
        max_wall_s: float = 3600.0,
        max_obs_lines: int = 200,
        max_line_chars: int = 400,
        pass_to_pass_sample: int | None = None,
        **limits: Any,
    ) -> None:
        super().__init__(max_steps=max_steps, max_wall_s=max_wall_s, **limits)
        if max_obs_lines < 2 or max_line_chars < 20:
            raise ValueError(
                f"SWEEnv: max_obs_lines={max_obs_lines} / max_line_chars={max_line_chars} leave nothing readable; "
                "use max_obs_lines >= 2 and max_line_chars >= 20"
            )
        if pass_to_pass_sample is not None and pass_to_pass_sample < 0:
            raise ValueError(f"SWEEnv: pass_to_pass_sample={pass_to_pass_sample}; use a count >= 0, or null for all")
        self.max_obs_lines, self.max_line_chars = int(max_obs_lines), int(max_line_chars)
        self.pass_to_pass_sample = pass_to_pass_sample
        from sao.envs.swe.tasks.instance import load_instances, validate_instance

        if tasks is None:
            self._tasks: list[dict[str, Any]] = []
        elif isinstance(tasks, str | Path):
            self._tasks = load_instances(tasks)
        else:
            self._tasks = [validate_instance(t) for t in tasks]
        if sandbox is None:
            sandbox = default_sandbox()
        elif isinstance(sandbox, dict):
            from sao.sandboxes.factory import sandbox_config_from_dict

            sandbox = sandbox_config_from_dict(sandbox)
        if sandbox.backend != "docker":
            raise ValueError(f"SWEEnv needs sandbox.backend='docker' (instances are images), got {sandbox.backend!r}")
        self.sandbox_cfg = sandbox
        self.grade_timeout_s = float(grade_timeout_s)
        self.tool_timeout_s = float(tool_timeout_s)
        self._sandbox: Sandbox | None = None
        self._task: dict[str, Any] | None = None

    @property
    def pids_per_episode(self) -> int:
        """The most processes one episode's sandboxes may hold at once: the agent's and, while it grades, the
        grader's (``setup`` checks the host's process table against this times the runner's concurrency)."""
        return 2 * self.sandbox_cfg.pids_limit

    # ---- ToolEnv hooks -------------------------------------------------------------------------------------
    def sample_task(self, rng: np.random.Generator) -> Any:
        if not self._tasks:
            raise ValueError(
                "SWEEnv has no task list: pass tasks=<jsonl path or records> or reset(options={'task': ...})"
            )
        return self._tasks[int(rng.integers(len(self._tasks)))]

    def parse_task(self, task: Any) -> dict[str, Any]:
        from sao.envs.swe.tasks.instance import validate_instance, with_official_image

        if isinstance(task, dict):
            task = with_official_image(task)
        record: dict[str, Any] = copy.deepcopy(validate_instance(task))
        if self.pass_to_pass_sample is not None and "sao_mutation" not in record:
            raise ValueError(
                f"task {record['instance_id']!r} is not an offline SAO task, so its eval script cannot run a sample "
                "of PASS_TO_PASS; set the env's pass_to_pass_sample to null"
            )
        return record

    def task_info(self, task: Any) -> dict[str, Any]:
        return {"task_id": task["instance_id"], "image": task["image"]}

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def task_prompt(self, task: Any) -> str:
        return (
            f"<issue>\n{task['problem_statement'].strip()}\n</issue>\n\n"
            f"The repository is checked out at {REPO_DIR}. Fix the issue, then call submit."
        )

    async def setup(self, task: Any) -> None:
        self._task = task
        image = task["image"]
        await asyncio.to_thread(_ensure_image, image, task["instance_id"], self.sandbox_cfg.docker_host)
        from sao.sandboxes.headroom import check_pid_headroom
        from sao.sandboxes.pool import acquire_sandbox, active_pools

        pools = active_pools()  # sized from the episode runner's concurrency: that many episodes at once
        if pools is not None:
            where = "concurrency (rollout.concurrency, eval --workers)"
            check_pid_headroom(pools.size, self.pids_per_episode, where, self.sandbox_cfg.docker_host)
        env = {"PATH": PATH, **self.sandbox_cfg.env}
        cfg = dataclasses.replace(self.sandbox_cfg, image=image, workdir=REPO_DIR, env=env)
        self._sandbox = await acquire_sandbox(cfg)  # warm when the episode runner keeps a pool of this image
        if not image.startswith(OWN_IMAGE_PREFIX):
            await self._scrub_history(task["base_commit"])
        await keep_base(self._sandbox)  # before the agent's first command: the base the patch is taken against

    async def _scrub_history(self, base_commit: str) -> None:
        assert self._sandbox is not None
        cmd = f"bash -c {shlex.quote(SCRUB_HISTORY)} scrub {shlex.quote(base_commit)}"
        res = await self._sandbox.exec(cmd, timeout=600)
        if res.exit_code != 0:
            raise SandboxError(
                f"could not remove the history past base_commit from {REPO_DIR} (exit {res.exit_code}): "
                f"{res.output[-500:]}"
            )

    def tools(self) -> list[Tool]:
        assert self._sandbox is not None
        return [
            BashTool(self._sandbox, workdir=REPO_DIR, timeout=self.tool_timeout_s),
            EditorTool(self._sandbox, workdir=REPO_DIR),
            SubmitTool("Submit your changes to the repository (its git diff) for grading; ends the episode."),
        ]

    async def take_turn(self, action: str) -> Turn:
        turn = await super().take_turn(action)
        turn.observation = cut_lines(turn.observation, self.max_obs_lines, self.max_line_chars)
        return turn

    async def teardown(self) -> None:
        sb, self._sandbox = self._sandbox, None
        if sb is not None:
            await sb.close()

    async def grade(self, submission: dict[str, Any]) -> Grade:
        return await self._grade_repo()

    async def on_truncation(self, reason: str) -> Grade | None:
        return await self._grade_repo()

    # ---- grading -------------------------------------------------------------------------------------------
    async def current_patch(self) -> str:
        """The repo's changes against the base kept at setup, taken by a git the agent cannot configure
        (``sao.envs.swe.repo_patch``); ``BrokenRepoError`` when the agent left nothing it can be taken from."""
        assert self._sandbox is not None
        return await take_patch(self._sandbox)

    async def _grade_repo(self) -> Grade:
        assert self._task is not None
        task = self._graded_task(self._task)
        iid = task["instance_id"]
        try:
            patch = await self.current_patch()
        except BrokenRepoError as e:  # the policy's doing: a scored failure with its reason, never an infra error
            report = {"instance_id": iid, "resolved": False, "model_patch": "", "failure": "broken_repo"}
            return Grade(reward=0.0, solved=False, report={**report, "reason": str(e)})
        try:
            result = await grade_patch_async(task, patch, timeout=self.grade_timeout_s, sandbox=self.sandbox_cfg)
        except GradingInfraError as e:
            raise SandboxError(str(e)) from e
        report = dict(result.report.get(iid, {}))
        report.update({"instance_id": iid, "model_patch": patch, "grading_s": result.seconds})
        report["dropped_paths"] = list(result.dropped)  # what the patch policy kept from the grader, and why
        report["tamper_signals"] = list(result.signals)  # lines that may tamper with pytest: flagged, not judged
        report.update(result.extra)  # why the patch's run failed (timeout, memory, disk, ...), when it did
        if self.pass_to_pass_sample is not None:
            report["pass_to_pass_sampled"] = len(task["PASS_TO_PASS"])
        return Grade(reward=1.0 if result.resolved else 0.0, solved=result.resolved, report=report)

    def _graded_task(self, task: dict[str, Any]) -> dict[str, Any]:
        """The record the reward grades: the task, or with ``pass_to_pass_sample`` its FAIL_TO_PASS + a sample."""
        if self.pass_to_pass_sample is None:
            return task
        from sao.envs.swe.tasks.instance import with_test_sample

        p2p = sorted(task["PASS_TO_PASS"])
        k = min(self.pass_to_pass_sample, len(p2p))
        picked = sorted(p2p[int(i)] for i in self.np_random.choice(len(p2p), size=k, replace=False)) if k else []
        return with_test_sample(task, picked)


def _ensure_image(image: str, instance_id: str, docker_host: str | None) -> None:
    """Make sure ``image`` is on the Docker host: present, or pulled for a published (registry) image."""
    from sao.sandboxes.images import ensure_image, image_exists

    if image_exists(image, docker_host):
        return
    if image.startswith(OWN_IMAGE_PREFIX):
        raise ImageNotFoundError(
            f"task {instance_id}: image {image} is not on the Docker host; rebuild it with "
            "`sao.envs.swe.tasks.ensure_task_images(records)` (or `sao tasks build`)"
        )
    try:
        ensure_image(image, docker_host, pull=True)
    except ImageNotFoundError as e:
        raise ImageNotFoundError(f"task {instance_id}: {e}") from e
