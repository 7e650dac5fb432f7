"""`sao serve`: launch a local inference server for a checkpoint; the body imports the engine lazily."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the serve command to the top-level app."""

    @app.command("serve")
    def serve(
        model_dir: str = typer.Argument(
            "", help="HF-format model dir, SAO checkpoint (config.json + safetensors) or a model alias (smollm2)"
        ),
        port: int = typer.Option(0, help="port on 127.0.0.1 (0: a free one)"),
        max_model_len: int = typer.Option(2048, help="context length"),
        kv_cache_gib: float = typer.Option(1.0, help="CPU KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE)"),
        dtype: str = typer.Option("float32", help="float32 | bfloat16"),
        log: str = typer.Option("", help="server log file (default: a temp file)"),
        gateway: str = typer.Option(
            "",
            help="serve SAO's recording OpenAI gateway in front of this model spec instead (hf:DIR, local:DIR, "
            "vllm:URL, smollm2): your own agent's episodes become trajectories (docs/gateway.md)",
        ),
        max_context: int = typer.Option(4096, help="--gateway: context budget per session (prompt + action)"),
        max_tokens: int = typer.Option(1024, help="--gateway: most tokens sampled per request"),
        temperature: float = typer.Option(1.0, help="--gateway: the sampling temperature (requests must match it)"),
        out: str = typer.Option("", help="--gateway: folder for trajectories.jsonl and sessions.jsonl"),
        idle_s: float = typer.Option(900.0, help="--gateway: close a session idle this long (as an infra error)"),
        tokenizer: str = typer.Option("", help="--gateway: tokenizer dir when the spec's own is not the right one"),
    ) -> None:
        """Start a vLLM server (vllm-cpu on CPU) with SAO's weight-reload extension; print its URL; Ctrl-C stops.
        With --gateway MODEL_SPEC: SAO's OpenAI-compatible gateway that records each session's tokens instead."""
        if gateway:
            _serve_gateway(gateway, port, max_context, max_tokens, temperature, out, idle_s, tokenizer)
            return
        if not model_dir:
            raise typer.BadParameter("pass a model dir (or alias), or --gateway MODEL_SPEC")
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


def _serve_gateway(
    spec: str, port: int, max_context: int, max_tokens: int, temperature: float, out: str, idle_s: float, tok: str
) -> None:
    """`sao serve --gateway`: the recording gateway until Ctrl-C (sessions still open are written as infra errors)."""
    import asyncio
    import signal
    from pathlib import Path

    from sao.agent.engines.registry import ModelSpecError
    from sao.agent.gateway.standalone import StandaloneOptions, run_standalone

    if max_tokens < 1 or max_context <= max_tokens:
        raise typer.BadParameter(f"need 1 <= --max-tokens ({max_tokens}) < --max-context ({max_context})")
    if idle_s <= 0:
        raise typer.BadParameter(f"--idle-s must be > 0 seconds, got {idle_s}")
    options = StandaloneOptions(
        port=port, max_context_tokens=max_context, max_action_tokens=max_tokens, temperature=temperature,
        out=Path(out) if out else None, idle_s=idle_s, tokenizer=tok or None,
    )  # fmt: skip
    if options.out is None:
        typer.echo("note: no --out: closed sessions are summarised here but their trajectories are not kept", err=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it like Ctrl-C
    try:
        asyncio.run(run_standalone(spec, options, echo=typer.echo))
    except ModelSpecError as e:
        raise typer.BadParameter(str(e)) from e
    except KeyboardInterrupt:
        pass
