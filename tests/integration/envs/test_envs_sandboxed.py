"""Tools and PythonToolEnv on the real sandboxes: bwrap (no Docker) and Docker with the offline base image."""

from __future__ import annotations

import json
from typing import Any

import pytest
from gymnasium.utils.env_checker import check_env

from sao.envs.python_tool import PythonToolEnv
from sao.envs.tools import BashTool, EditorTool, PythonTool

pytestmark = pytest.mark.timeout(180)


def call(name: str, **args: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


@pytest.fixture(params=["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def sandbox_cfg(request: pytest.FixtureRequest) -> dict[str, Any]:
    if request.param == "bwrap":
        request.getfixturevalue("bwrap_ok")
        return {"backend": "bwrap", "mem_limit": "1g"}
    return {"backend": "docker", "image": request.getfixturevalue("base_image"), "mem_limit": "512m"}


def test_python_tool_env_episode(sandbox_cfg: dict[str, Any]) -> None:
    env = PythonToolEnv(sandbox=sandbox_cfg, code_timeout=20)
    task = {"id": "frac", "problem": "Compute 1/8 + 3/8 as a fraction.", "answer": r"\frac{1}{2}"}
    env.reset(options={"task": task})
    obs, _, _, _, info = env.step(
        call("python", code="from fractions import Fraction\nq = Fraction(1, 8) + Fraction(3, 8)")
    )
    assert info["exit_code"] == 0, obs
    obs, *_ = env.step("```python\nprint(q, float(q))\n```")
    assert obs.strip() == "1/2 0.5"
    obs, *_ = env.step(call("python", code="import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=3)"))
    assert "Error" in obs  # no network in the sandbox
    _, reward, terminated, _, info = env.step(r"The sum is \boxed{0.5}")
    assert (reward, terminated, info["solved"]) == (1.0, True, True)
    env.close()


def test_check_env_with_a_real_sandbox(sandbox_cfg: dict[str, Any]) -> None:
    env = PythonToolEnv(sandbox=sandbox_cfg, max_steps=3)
    check_env(env, skip_render_check=True)
    env.close()


async def test_bash_editor_python_tools_in_sandbox(sandbox_cfg: dict[str, Any]) -> None:
    from sao.sandboxes.factory import make_sandbox, sandbox_config_from_dict

    async with await make_sandbox(sandbox_config_from_dict(sandbox_cfg)) as sb:
        workdir = "/work" if sandbox_cfg["backend"] == "bwrap" else "/tmp"
        ed, bash = EditorTool(sb, workdir=workdir), BashTool(sb, workdir=workdir, timeout=20)
        r = await ed({"command": "create", "path": "calc.py", "file_text": "def add(a, b):\n    return a - b\n"})
        assert not r.error, r.output
        r = await ed({"command": "str_replace", "path": "calc.py", "old_str": "a - b", "new_str": "a + b"})
        assert not r.error, r.output
        r = await bash({"command": "python3 -c 'import calc; print(calc.add(2, 3))'"})
        assert r.exit_code == 0 and r.output.strip() == "5"
        r = await ed({"command": "str_replace", "path": "calc.py", "old_str": "a - b", "new_str": "x"})
        assert r.error and "did not appear verbatim" in r.output
        r = await ed({"command": "view", "path": workdir})
        assert "calc.py" in r.output
        py = PythonTool(sb, workdir=workdir, timeout=20)
        assert (await py({"code": "n = 21"})).exit_code == 0
        assert (await py({"code": "n * 2"})).output.strip() == "42"
