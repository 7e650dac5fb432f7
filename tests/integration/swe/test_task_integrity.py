"""No reachable fix in any task image: every image the offline builder made is audited for the gold patch's files.

What an agent could use to read the fix instead of finding it: git history or reflog, an object in the store that
holds a fixed file, or the fixed code anywhere else in the image, whatever its name: a copy (site-packages, caches,
vendored), an archive holding one (the package's own wheel or sdist), stale bytecode. Each check runs inside a
container of the task image, as the agent would see it.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from sao.envs.swe.tasks.audit import audit_image, problems
from sao.sandboxes.docker import tar_one

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(600)]


def test_every_task_image_holds_no_reachable_fix(offline_tasks: list[dict[str, Any]], docker_client: Any) -> None:
    assert offline_tasks
    for task in offline_tasks:
        found = audit_image(docker_client, task)
        where = f"{task['instance_id']} ({task['image']}): {found}"
        assert not found.get("apply_failed"), where
        assert found["head"] == task["base_commit"], where
        assert found["commits_all"] == 1 and found["refs"] == ["refs/heads/main"], where
        assert found["reflog_entries"] == 0 and not found["logs_dir"] and found["stash"] == 0, where
        assert found["post_image_ids_in_store"] == [], where
        assert found["unreachable_objects"] == 0, where
        assert found["fix_hunks"] >= 1 and found["files_scanned"] > 1000, where
        assert found["copies_of_the_fix"] == [], where  # e.g. pip/_vendor/six.py in six tasks
        assert found["bytecode_of_the_fix"] == [], where  # e.g. pip/_vendor/__pycache__/six.*.pyc
        assert problems(found, task) == [], where


def _module_of(task: dict[str, Any]) -> str:
    parts = str(task["sao_mutation"]["path"]).split("/")
    return (parts[1:] if parts[0] == "src" else parts)[0].removesuffix(".py")


def test_the_audit_refuses_copies_of_the_fix_and_accepts_namesakes(
    offline_tasks: list[dict[str, Any]], docker_client: Any
) -> None:
    """Both ways: the fixed code one commit back, renamed in a cache, inside an archive with an innocent name and as
    stale bytecode is refused; a same-name module with other code and a console-script launcher (what the name-based
    audit took for copies in idna's image) are not."""
    task = offline_tasks[0]
    mod, path = _module_of(task), task["sao_mutation"]["path"]
    pyc = f"import py_compile; py_compile.compile('{path}', cfile='/opt/stale/__pycache__/x.cpython-311.pyc')"
    # Deflated: only opening the archive shows the fixed code.
    wheel = f"import zipfile as z; z.ZipFile('/var/cache/blob.bin', 'w', z.ZIP_DEFLATED).write('{path}', 'pkg/x.py')"
    leak = (
        "cd /testbed && git apply /tmp/gold.diff && git add -A && git -c user.name=x -c user.email=x@x commit -qm fix"
        f" && mkdir -p /root/.cache/pip /opt/stale && cp {path} /root/.cache/pip/3f2a9c"
        f' && python3 -c "{pyc}" && python3 -c "{wheel}"'
        " && git apply -R /tmp/gold.diff && git -c user.name=x -c user.email=x@x commit -qam bug"
        f" && mkdir -p /opt/other && printf 'def unrelated():\\n    return 42\\n' > /opt/other/{mod}.py"
        f" && printf '#!/opt/venv/bin/python3\\nimport sys\\nfrom {mod} import main\\nsys.exit(main())\\n'"
        f" > /opt/venv/bin/{mod} && chmod +x /opt/venv/bin/{mod}"
    )
    container = docker_client.containers.run(
        task["image"], ["sleep", "infinity"], detach=True, network_mode="none", labels={"sao.role": "test-audit"}
    )
    try:
        patch = task["patch"] if task["patch"].endswith("\n") else task["patch"] + "\n"
        assert container.put_archive("/tmp", tar_one("gold.diff", patch.encode()))
        res = container.exec_run(["bash", "-c", leak])
        assert res.exit_code == 0, res.output.decode()
        leaky = container.commit(repository="sao-test-leaky", tag="audit")
    finally:
        container.remove(force=True)
    try:
        found = audit_image(docker_client, {**task, "image": "sao-test-leaky:audit"})
        assert found["commits_all"] == 3 and found["reflog_entries"] > 0, found
        assert found["post_image_ids_in_store"], found
        assert sorted(found["copies_of_the_fix"]) == ["/root/.cache/pip/3f2a9c", "/var/cache/blob.bin!pkg/x.py"]
        assert found["bytecode_of_the_fix"] == ["/opt/stale/__pycache__/x.cpython-311.pyc"], found
        # HEAD, commits, reflog, fixed blobs, copies, bytecode; the namesakes are in neither list above.
        assert len(problems(found, task)) == 6, problems(found, task)
    finally:
        docker_client.images.remove(leaky.id, force=True)


# An image laid out like the official SWE-bench images built by older harness versions: the whole clone kept, HEAD
# reset to base_commit, the fix reachable from a tag, a remote-tracking ref and the reflog.
LEAKY_REPO = r"""set -e
mkdir /testbed && cd /testbed && git init -q -b main .
export GIT_AUTHOR_NAME=dev GIT_AUTHOR_EMAIL=dev@x GIT_COMMITTER_NAME=dev GIT_COMMITTER_EMAIL=dev@x
printf 'def f():\n    return 0\n' > m.py
printf 'from m import f\n\ndef test_f():\n    assert f() == 1\n' > test_m.py
git add -A && git commit -qm 'buggy base'
git rev-parse HEAD > /base
printf 'def f():\n    return 1\n' > m.py
git commit -qam 'the fix' && git hash-object m.py > /fixed_blob
git tag v2 && git update-ref refs/remotes/origin/main HEAD
git reset -q --hard HEAD~1
"""


def _eval_script(base: str) -> str:
    check = "import m; print('PASSED test_m.py::test_f' if m.f() == 1 else 'FAILED test_m.py::test_f')"
    return "\n".join(
        [
            "#!/bin/bash",
            "cd /testbed",
            f"git checkout {base} -- test_m.py",
            ": '>>>>> Start Test Output'",
            f'python3 -c "{check}"',
            ": '>>>>> End Test Output'",
            "",
        ]
    )


def test_images_made_elsewhere_lose_their_future_history(base_image: str, docker_client: Any) -> None:
    import sao.envs  # noqa: F401 - registers the sao/ ids
    from sao.envs.swe.env import SWEEnv

    box = docker_client.containers.run(
        base_image, ["sleep", "infinity"], detach=True, network_mode="none", labels={"sao.role": "test-audit"}
    )
    try:
        res = box.exec_run(["bash", "-c", LEAKY_REPO])
        assert res.exit_code == 0, res.output.decode()
        base = box.exec_run(["cat", "/base"]).output.decode().strip()
        fixed_blob = box.exec_run(["cat", "/fixed_blob"]).output.decode().strip()
        image = box.commit(repository="sao-test-official-like", tag="leaky")
    finally:
        box.remove(force=True)
    gold = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 0\n"
    gold += "+    return 1\n"
    task = {
        "instance_id": "octo__demo-1",
        "repo": "octo/demo",
        "version": "1.0",
        "base_commit": base,
        "problem_statement": "test_m.py::test_f fails",
        "patch": gold,
        "test_patch": "",
        "FAIL_TO_PASS": ["test_m.py::test_f"],
        "PASS_TO_PASS": [],
        "image": "sao-test-official-like:leaky",
        "eval_script": _eval_script(base),
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
    }
    env = SWEEnv([task])
    try:
        env.reset(seed=0)

        def bash(command: str) -> str:
            call = json.dumps({"name": "bash", "arguments": {"command": command}})
            return env.step(f"<tool_call>{call}</tool_call>")[0]

        # Before the scrub every one of these would show the fix.
        assert bash("git log --all --format=%H | wc -l").split()[0] == "1"
        assert bash("git tag; git branch -a; git reflog | wc -l").split() == ["*", "main", "0"]
        assert "[exit code" in bash(f"git cat-file -e {fixed_blob}")
        assert "[exit code" in bash(f"git cat-file -e {base}")
        assert bash("git status --porcelain") == "[no output]"
        # The grader (a fresh container of the unchanged image) still knows base_commit and restores the tests.
        bash("printf 'def f():\\n    return 1\\n' > m.py && echo 'def test_f(): pass' > test_m.py")
        _, reward, terminated, _, info = env.step('<tool_call>{"name": "submit", "arguments": {}}</tool_call>')
        assert terminated and reward == 1.0, info
        assert [d["path"] for d in info["report"]["dropped_paths"]] == ["test_m.py"]  # the test edit never graded
    finally:
        env.close()
        docker_client.images.remove(image.id, force=True)


def _fake_tests(test_ids: list[str]) -> dict[str, str]:
    """Per test file, a replacement in which every listed test (``f::t``, ``f::Class::t``, ``f::t[id]``) passes."""
    files: dict[str, dict[str, dict[str, list[str]]]] = {}
    for tid in test_ids:
        path, *names = tid.split("::")
        name, _, param = names[-1].partition("[")
        group = files.setdefault(path, {}).setdefault(names[0] if len(names) > 1 else "", {})
        ids = group.setdefault(name, [])
        if param:
            ids.append(param[:-1])
    out = {}
    for path, groups in files.items():
        lines = ["import pytest"]
        for cls, tests in groups.items():
            pad = "    " if cls else ""
            if cls:
                lines.append(f"class {cls}:")
            for name, ids in tests.items():
                if ids:
                    lines.append(f"{pad}@pytest.mark.parametrize('p', {ids!r}, ids={ids!r})")
                lines.append(f"{pad}def {name}({'self, ' if cls else ''}{'p' if ids else ''}):\n{pad}    pass")
        out[path] = "\n".join(lines) + "\n"
    return out


def test_the_grader_restores_test_files_before_running_them(
    offline_tasks: list[dict[str, Any]], docker_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A patch that rewrites the tests to pass (instead of fixing the code) is not resolved, by two guards each on its
    own: the patch policy drops test files before grading, and the eval script checks the test files out of
    ``base_commit`` first. Without both the same patch would resolve the task."""
    import sao.envs.swe.grading as grading
    from sao.envs.swe.grading import grade_patch
    from sao.envs.swe.patch_policy import PolicyResult

    task = offline_tasks[0]
    box = docker_client.containers.run(
        task["image"], ["sleep", "infinity"], detach=True, network_mode="none", labels={"sao.role": "test-audit"}
    )
    try:
        for path, text in _fake_tests(task["FAIL_TO_PASS"] + task["PASS_TO_PASS"]).items():
            assert box.put_archive(f"/testbed/{os.path.dirname(path)}", tar_one(os.path.basename(path), text.encode()))
        cheat = box.exec_run(["git", "diff"], workdir="/testbed").output.decode()
    finally:
        box.remove(force=True)
    assert cheat.startswith("diff --git")
    no_restore = "\n".join(ln for ln in task["eval_script"].splitlines() if not ln.startswith("git checkout "))
    dropped = grade_patch({**task, "eval_script": no_restore}, cheat)  # the policy alone
    assert not dropped.resolved and not dropped.applied and {d["kind"] for d in dropped.dropped} == {"tests"}
    monkeypatch.setattr(grading, "apply_policy", lambda patch: PolicyResult(patch))  # the eval script alone
    graded = grade_patch(task, cheat)
    assert graded.applied and not graded.resolved, graded.log[-2000:]
    unguarded = grade_patch({**task, "eval_script": no_restore}, cheat)
    assert unguarded.resolved, unguarded.log[-2000:]


def test_the_agent_container_holds_none_of_the_graders_files(offline_tasks: list[dict[str, Any]]) -> None:
    """The eval script, the gold patch and the test lists live only in the grader's fresh container and the
    host's task record; the agent's container gets the repository and the problem statement."""
    import sao.envs  # noqa: F401 - registers the sao/ ids
    from sao.envs.swe.env import SWEEnv

    task = offline_tasks[0]
    env = SWEEnv([task])
    try:
        env.reset(seed=0)
        call = json.dumps({"name": "bash", "arguments": {"command": "ls /eval.sh /tmp/patch.diff /tmp/gold.diff; env"}})
        out = env.step(f"<tool_call>{call}</tool_call>")[0]
        assert out.count("No such file or directory") == 3, out
        for secret in (task["FAIL_TO_PASS"][0], task["instance_id"], "eval_script", ">>>>> Start Test Output"):
            assert secret not in out, secret
    finally:
        env.close()
