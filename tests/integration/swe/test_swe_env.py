"""SWEEnv on built offline tasks: gold via tool calls -> 1, empty submit -> 0, Docker dying -> infra_error."""

from __future__ import annotations

import json
from typing import Any

import gymnasium
import pytest

import sao.envs  # noqa: F401 - registers the sao/ ids
from sao.envs.swe.env import SWEEnv
from sao.sandboxes.protocols import ImageNotFoundError

pytestmark = pytest.mark.docker


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def editor_calls(patch: str) -> list[str]:
    """The fix patch as str_replace_editor calls: each hunk's old lines -> new lines (context included)."""
    calls: list[str] = []
    old: list[str] = []
    new: list[str] = []
    path = ""

    def flush() -> None:
        if old or new:
            calls.append(
                call(
                    "str_replace_editor",
                    command="str_replace",
                    path=path,
                    old_str="\n".join(old),
                    new_str="\n".join(new),
                )
            )
        old.clear()
        new.clear()

    for line in patch.splitlines():
        if line.startswith("+++ b/"):
            path = line[len("+++ b/") :]
        elif line.startswith(("---", "diff ", "index ")):
            continue
        elif line.startswith("@@"):
            flush()
        elif line.startswith("-"):
            old.append(line[1:])
        elif line.startswith("+"):
            new.append(line[1:])
        elif line.startswith(" ") or line == "":
            old.append(line[1:])
            new.append(line[1:])
    flush()
    return calls


def test_gold_patch_through_the_editor_is_resolved(offline_tasks: list[dict[str, Any]]) -> None:
    task = offline_tasks[0]
    env = gymnasium.make("sao/SWE-v0", tasks=offline_tasks)
    try:
        obs, info = env.reset(options={"task": task})
        assert task["FAIL_TO_PASS"][0] in obs and info["task_id"] == task["instance_id"]
        assert {t["function"]["name"] for t in info["tools"]} == {"bash", "str_replace_editor", "submit"}
        for action in editor_calls(task["patch"]):
            obs, reward, terminated, truncated, info = env.step(action)
            assert not terminated and "Error" not in obs, obs
        obs, reward, terminated, truncated, info = env.step(call("submit"))
        assert terminated and not truncated and "infra_error" not in info
        assert reward == 1.0 and info["solved"], info["report"]
        assert info["report"]["resolved"] and info["report"]["model_patch"].strip()
    finally:
        env.close()


def test_gold_via_bash_graded_at_the_step_limit(offline_tasks: list[dict[str, Any]]) -> None:
    task = next(t for t in offline_tasks if t["repo"] != offline_tasks[0]["repo"])
    env = SWEEnv(max_steps=1)
    try:
        env.reset(options={"task": task})
        cmd = f"git apply - <<'EOF_SAO'\n{task['patch']}EOF_SAO\ngit status --short"
        obs, reward, _, truncated, info = env.step(call("bash", command=cmd))
        assert truncated and info["truncation_reason"] == "step_limit"
        assert reward == 1.0 and info["report"]["resolved"], (obs, info["report"])
    finally:
        env.close()


def test_empty_submit_is_not_resolved(offline_tasks: list[dict[str, Any]]) -> None:
    env = SWEEnv(offline_tasks)
    try:
        env.reset(seed=3)
        _, reward, terminated, _, info = env.step(call("submit"))
        assert terminated and reward == 0.0 and not info["solved"]
        assert "infra_error" not in info and info["report"]["resolved"] is False
    finally:
        env.close()


def test_container_killed_mid_episode_is_an_infra_error(
    offline_tasks: list[dict[str, Any]], docker_client: Any
) -> None:
    env = SWEEnv(offline_tasks)
    try:
        env.reset(seed=0)
        obs, *_ = env.step(call("bash", command="echo alive"))
        assert "alive" in obs
        docker_client.containers.get(env._sandbox.id).remove(force=True)  # type: ignore[union-attr]
        obs, reward, terminated, truncated, info = env.step(call("bash", command="ls"))
        assert truncated and not terminated and info["infra_error"]
        assert reward == 0.0 and not info["solved"]
    finally:
        env.close()


def test_missing_image_is_a_clear_error(offline_tasks: list[dict[str, Any]]) -> None:
    task = dict(offline_tasks[0], image="sao-swe-nothere:0.0-bug-000000000000")
    env = SWEEnv()
    try:
        with pytest.raises(ImageNotFoundError, match=r"sao-swe-nothere.*ensure_task_images"):
            env.reset(options={"task": task})
    finally:
        env.close()


def test_check_env_passes(offline_tasks: list[dict[str, Any]]) -> None:
    from gymnasium.utils.env_checker import check_env

    env = SWEEnv(offline_tasks[:2], max_steps=2)
    try:
        check_env(env, skip_render_check=True)
    finally:
        env.close()
