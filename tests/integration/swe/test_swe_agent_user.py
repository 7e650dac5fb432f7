"""SWEEnv's bash and editor as the unprivileged user: the repo is its own, hostile commands are scored, endings told."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sao.envs.swe.env import SWEEnv

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_swe_tools_run_unprivileged_and_say_how_commands_ended(offline_tasks: list[dict[str, Any]]) -> None:
    sandbox = {"backend": "docker", "mem_limit": "512m", "cpus": 1.0, "pids_limit": 256, "disk_limit": "256m"}
    env = SWEEnv(offline_tasks, sandbox=sandbox, tool_timeout_s=60)
    try:
        env.reset(seed=0)
        obs, *_ = env.step(call("bash", command="id -u; stat -c %u /testbed .git; git status --porcelain | wc -l"))
        assert obs.split() == ["1000", "1000", "1000", "0"], obs
        # The editor writes as the same user: bash may append to what it made.
        obs, *_ = env.step(call("str_replace_editor", command="create", path="notes.txt", file_text="a\n"))
        assert "File created" in obs, obs
        assert env.step(call("bash", command="echo b >> notes.txt && cat notes.txt && rm notes.txt"))[0] == "a\nb\n"
        obs, *_, info = env.step(call("str_replace_editor", command="create", path="/etc/evil", file_text="x"))
        assert info["tool_error"] and "Permission denied" in obs and "infra_error" not in info, obs
        obs, _, terminated, truncated, info = env.step(call("bash", command="kill -9 1; kill -9 -1"))
        assert "infra_error" not in info and not terminated and not truncated, obs
        obs, *_, info = env.step(call("bash", command="python3 -c 'b = bytearray(2 << 30)'"))
        assert "[killed for memory (exit code 137)" in obs, obs
        obs, *_ = env.step(call("bash", command="head -c 1G /dev/zero > /tmp/big; rm -f /tmp/big"))
        assert "File size limit exceeded" in obs and "[a write was refused" in obs, obs
        _, reward, terminated, _, info = env.step(call("submit"))
        assert terminated and reward == 0.0 and "infra_error" not in info and info["report"]["resolved"] is False
    finally:
        env.close()
