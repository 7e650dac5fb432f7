"""`sao serve`: launch a local inference server for a checkpoint; the body imports the engine lazily."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the serve command to the top-level app."""

    @app.command("serve")
    def serve(
        model_dir: str = typer.Argument(
            ..., help="HF-format model dir, SAO checkpoint (config.json + safetensors) or a model alias (smollm2)"
        ),
        port: int = typer.Option(0, help="port on 127.0.0.1 (0: a free one)"),
        max_model_len: int = typer.Option(2048, help="context length"),
        kv_cache_gib: float = typer.Option(1.0, help="CPU KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE)"),
        dtype: str = typer.Option("float32", help="float32 | bfloat16"),
        log: str = typer.Option("", help="server log file (default: a temp file)"),
    ) -> None:
        """Start a vLLM server (vllm-cpu on CPU) with SAO's weight-reload extension; print its URL; Ctrl-C stops."""
        import signal
        import time
        from pathlib import Path

        from sao.agent.engines.protocols import EngineError
        from sao.agent.engines.vllm_server import LocalVLLMServer
        from sao.core.paths import resolve_model_path

        model_dir = resolve_model_path(model_dir)
        if not Path(model_dir, "config.json").exists():
            raise typer.BadParameter(f"{model_dir} has no config.json: pass a model dir or a checkpoint dir")
        typer.echo(f"starting vLLM on {model_dir} (takes ~1-2 min on CPU) ...", err=True)
        try:
            server = LocalVLLMServer.start(
                model_dir, port=port or None, log_path=log or None, max_model_len=max_model_len,
                kv_cache_gib=kv_cache_gib, dtype=dtype,
            )  # fmt: skip
        except EngineError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from e
        # The server runs in its own session: a SIGTERM to `sao serve` must still stop it.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        typer.echo(server.url)
        typer.echo(f"log: {server.log_path}; OpenAI API at {server.url}/v1; Ctrl-C to stop", err=True)
        try:
            while server.alive():
                time.sleep(1.0)
            typer.echo(f"error: the server exited; see {server.log_path}", err=True)
            raise typer.Exit(1)
        except KeyboardInterrupt:
            pass
        finally:
            server.stop()
