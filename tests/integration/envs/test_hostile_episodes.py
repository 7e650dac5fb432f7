"""PythonToolEnv episodes whose tool call is hostile or careless code, on the real sandboxes (issue 24's cases).

What must hold: the agent cannot end its episode as an infra error by killing its sandbox (and if the sandbox dies
during its command anyway, the episode is scored as a failure); a write past the disk limit is refused and the agent
is told; a command killed for memory says so.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from sao.envs.python_tool import PythonToolEnv

pytestmark = pytest.mark.timeout(240)
TASK = {"id": "t", "problem": "What is 2 + 2?", "answer": "4"}


def call(name: str, **args: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


@pytest.fixture(params=["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def sandbox_cfg(request: pytest.FixtureRequest) -> dict[str, Any]:
    # The setting: 512 MiB, code timeout 10 s (here 20 s: a loaded CI machine), and a 256 MiB disk limit.
    if request.param == "bwrap":
        request.getfixturevalue("bwrap_ok")
        return {"backend": "bwrap", "mem_limit": "512m", "disk_limit": "256m"}
    image = request.getfixturevalue("base_image")
    return {"backend": "docker", "image": image, "mem_limit": "512m", "disk_limit": "256m", "pids_limit": 64}


def test_killing_every_process_does_not_end_the_episode(sandbox_cfg: dict[str, Any]) -> None:
    env = PythonToolEnv(sandbox=sandbox_cfg, code_timeout=20)
    try:
        env.reset(options={"task": TASK})
        code = "import os, signal, subprocess\ntry:\n    os.kill(1, signal.SIGKILL)\nexcept OSError as e:\n"
        code += "    print(e)\nsubprocess.run('kill -9 -1', shell=True)\nprint('after')"
        obs, reward, terminated, truncated, info = env.step(call("python", code=code))
        assert "infra_error" not in info and not terminated and not truncated, (obs, info)
        obs, *_, info = env.step(call("python", code="import os\nprint('still here', os.getuid())"))
        assert "still here 1000" in obs and "infra_error" not in info
        _, reward, terminated, _, info = env.step(r"\boxed{4}")
        assert (reward, terminated, info["solved"]) == (1.0, True, True)
    finally:
        env.close()


@pytest.mark.docker
def test_a_sandbox_dying_during_the_agents_command_is_a_scored_failure(base_image: str, docker_client: Any) -> None:
    """The agent cannot kill its container any more; something it caused still could (an escape, the memory
    killer taking init). Stood in for by killing the container from outside while the agent's command runs."""
    env = PythonToolEnv(sandbox={"backend": "docker", "image": base_image, "mem_limit": "512m"}, code_timeout=60)
    try:
        env.reset(options={"task": TASK})
        sandbox_id = env._sandbox.id  # type: ignore[union-attr]
        killer = threading.Timer(3.0, docker_client.api.kill, args=(sandbox_id,))
        killer.start()
        obs, reward, terminated, truncated, info = env.step(call("python", code="import time\ntime.sleep(40)"))
        killer.join()
        assert "infra_error" not in info, info
        assert (reward, terminated, truncated, info["solved"]) == (0.0, True, False, False)
        assert info["report"]["failure"] == "sandbox_died"
        assert "the sandbox died during the agent's command" in info["report"]["reason"]
        assert "sandbox died during your command" in obs
    finally:
        env.close()


def test_a_gigabyte_written_to_tmp_is_refused_at_the_disk_limit(sandbox_cfg: dict[str, Any]) -> None:
    env = PythonToolEnv(sandbox=sandbox_cfg, code_timeout=60)
    try:
        env.reset(options={"task": TASK})
        one_file = "import os\nchunk = b'x' * (1 << 20)\ntry:\n    with open('/tmp/big', 'wb') as f:\n"
        one_file += "        for _ in range(1024):\n            f.write(chunk)\nfinally:\n"
        one_file += "    print('size', os.path.getsize('/tmp/big'))\n    os.remove('/tmp/big')\n"
        obs, *_, info = env.step(call("python", code=one_file))
        assert "infra_error" not in info
        assert "File too large" in obs or "No space left" in obs, obs
        assert "[a write was refused" in obs
        assert int(obs.split("size ")[1].split()[0]) <= 256 << 20
        # Many files, each under the limit: the sandbox's total is watched (docker's writable layer; bwrap's
        # /work, and its /tmp is a tmpfs of the limit's size).
        where = "/tmp" if sandbox_cfg["backend"] == "docker" else "."
        many = "import time\nchunk = b'x' * (1 << 20)\nfor i in range(64):\n"
        many += f"    open(f'{where}/f{{i}}', 'wb').write(chunk * 16)\n    time.sleep(0.05)\n"
        many += "time.sleep(5)\nprint('wrote all')"
        t0 = time.monotonic()
        obs, *_, info = env.step(call("python", code=many))
        assert "infra_error" not in info
        assert "wrote all" not in obs and ("disk limit" in obs or "No space left" in obs), obs
        assert time.monotonic() - t0 < 50
        clean = f"import glob, os\nfor p in glob.glob('{where}/f*'):\n    os.remove(p)\nprint('ok')"
        obs, *_, info = env.step(call("python", code=clean))
        assert obs.strip() == "ok", obs
    finally:
        env.close()


def test_a_memory_kill_is_reported_to_the_agent(sandbox_cfg: dict[str, Any]) -> None:
    env = PythonToolEnv(sandbox=sandbox_cfg, code_timeout=60)
    try:
        env.reset(options={"task": TASK})
        obs, *_, info = env.step(call("python", code="b = bytearray(2 << 30)\nprint(len(b))"))
        assert "infra_error" not in info and obs != "[no output]"
        if sandbox_cfg["backend"] == "docker":  # the cgroup's OOM killer
            assert "[killed for memory (exit code 137)" in obs, obs
        else:  # bwrap caps the address space: the allocation fails inside Python
            assert "MemoryError" in obs, obs
        assert "alive" in env.step(call("python", code="print('alive')"))[0]
    finally:
        env.close()
