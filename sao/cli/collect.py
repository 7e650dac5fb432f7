"""`sao collect`: roll out any model spec on any registered env through the one episode runner, durably, resumably.

Writes in ``--out``: ``trajectories.jsonl`` (the records ``sao sft --min-reward`` and ``sao pretrain-value`` read;
one line per finished episode, fsynced as it finishes; an outside agent's episode, ``--agent mini-swe-agent``, has
one line per row of its gateway session), ``infra_errors.jsonl`` (episodes the infrastructure failed:
counted apart, never mixed with the data) and ``summary.json``. Episode i plays task ``i mod len(tasks)`` of
``--tasks`` (or, without it, the env's own task drawn with seed ``--seed + i``) and is reset with seed
``--seed + i``. A rerun with the same ``--out`` skips the episode indices already in ``trajectories.jsonl`` and
retries the infra errors; the summary line counts the whole folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from sao.core.console import third_party_to_log

TRAJECTORIES = "trajectories.jsonl"
INFRA_ERRORS = "infra_errors.jsonl"


@dataclass(frozen=True)
class CollectConfig:
    """Options of ``sao collect`` (see ``sao collect --help``)."""

    model: str
    env: str
    n: int
    out: Path
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    tasks: str | None = None
    concurrency: int = 4
    seed: int = 0
    max_turns: int = 8
    max_action_tokens: int = 256
    max_context_tokens: int = 2048
    temperature: float = 1.0
    tokenizer: str | None = None
    progress: bool = True
    agent: str = "sao"
    agent_config: str = ""

    def __post_init__(self) -> None:
        for name in ("n", "concurrency", "max_turns", "max_action_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.temperature < 0:
            raise ValueError(f"--temperature must be >= 0 (0 = greedy), got {self.temperature}")
        from sao.agent.harness.registry import harness_spec

        try:
            harness_spec(self.agent).check_env(self.env)
        except ValueError as e:
            raise ValueError(f"--agent {self.agent}: {e}") from e


def finished_indices(out: Path) -> set[int]:
    """Episode indices already in ``out/trajectories.jsonl`` (a torn last line, from a crash mid-write, is ignored)."""
    from sao.core.jsonl import iter_jsonl

    path = out / TRAJECTORIES
    if not path.exists():
        return set()
    done = set()
    for _, rec in iter_jsonl(path, torn_tail_ok=True, fix=f"delete that line of {path} and rerun"):
        index = (rec.get("info") or {}).get("episode") if isinstance(rec, dict) else None
        if isinstance(index, int):
            done.add(index)
    return done


def summarize(out: Path, n: int, wall_s: float, skipped: int) -> dict[str, Any]:
    """Counts over the whole folder: episodes by status, infra errors (apart), mean reward, solved rate (an outside
    agent's episode may have several rows: it counts once, by its last row; ``rows`` counts them all)."""
    from sao.agent.episodes import is_last_row
    from sao.agent.records import read_jsonl

    rows = list(read_jsonl(out / TRAJECTORIES)) if (out / TRAJECTORIES).exists() else []
    trajs = [t for t in rows if is_last_row(t)]
    infra_path = out / INFRA_ERRORS
    retried = {t.info.get("episode") for t in trajs}
    infra = [t for t in read_jsonl(infra_path) if t.info.get("episode") not in retried] if infra_path.exists() else []
    by_status: dict[str, int] = {}
    for t in trajs:
        by_status[t.status] = by_status.get(t.status, 0) + 1
    rewards = [t.reward for t in trajs]
    solved = [bool(t.info.get("solved", t.reward > 0)) for t in trajs]
    return {
        "requested": n,
        "episodes": len(trajs),
        "rows": len(rows),
        "by_status": by_status,
        "infra_errors": len({t.info.get("episode") for t in infra}),
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "solved_rate": sum(solved) / len(solved) if solved else None,
        "skipped_already_done": skipped,
        "wall_s": round(wall_s, 1),
    }


async def collect(cfg: CollectConfig) -> dict[str, Any]:
    """Run (or resume) the collection into ``cfg.out``; returns the summary (also in ``summary.json``)."""
    from sao.agent.episodes import Episode, EpisodeRunner, RunnerConfig, env_factory, task_id_of
    from sao.agent.harness.registry import describe_harness
    from sao.agent.records import Trajectory, write_jsonl
    from sao.envs.registration import preflight
    from sao.eval.common import opened_model, parse_model_spec, write_json

    spec = parse_model_spec(cfg.model)
    preflight(cfg.env, cfg.env_kwargs)  # a bad id or kwargs fail here, not as n infra errors
    tasks: list[dict[str, Any]] | None = None
    if cfg.tasks:
        from sao.envs.datasets import load_tasks

        tasks = load_tasks(cfg.tasks)
    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    done = finished_indices(out)
    todo = [i for i in range(cfg.n) if i not in done]
    episodes = []
    for i in todo:
        task = tasks[i % len(tasks)] if tasks else None
        episodes.append(Episode(i, task, cfg.seed + i, task_id_of(task, i) if task is not None else None))
    t0 = time.perf_counter()
    if episodes:
        build = dict(tokenizer=cfg.tokenizer, max_context_tokens=cfg.max_context_tokens,
                     max_action_tokens=cfg.max_action_tokens, temperature=cfg.temperature,
                     tasks=tuple(e.task for e in episodes if e.task is not None))  # fmt: skip
        async with opened_model(spec, sorted({e.task_id for e in episodes if e.task_id}), **build) as model:
            player = model.player(max_turns=cfg.max_turns, harness=cfg.agent, harness_config=cfg.agent_config)
            runner = EpisodeRunner(
                env_factory(cfg.env, cfg.env_kwargs), player, RunnerConfig(cfg.concurrency, cfg.progress)
            )

            async def write(traj: Trajectory) -> None:
                name = INFRA_ERRORS if traj.status == "infra_error" else TRAJECTORIES
                await asyncio.to_thread(write_jsonl, out / name, [traj])

            await runner.run(episodes, on_trajectory=write)
    summary = summarize(out, cfg.n, time.perf_counter() - t0, skipped=len(done & set(range(cfg.n))))
    summary.update(model=spec.name, env=cfg.env, out=str(out), agent=describe_harness(cfg.agent, cfg.agent_config))
    write_json(out / "summary.json", summary)
    return summary


def summary_line(s: dict[str, Any]) -> str:
    def num(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    statuses = ", ".join(f"{k} {v}" for k, v in sorted(s["by_status"].items())) or "none"
    return (
        f"collected {s['episodes']}/{s['requested']} episodes ({statuses}), infra errors {s['infra_errors']} "
        f"(not in the data), mean reward {num(s['mean_reward'])}, solved {num(s['solved_rate'])}, "
        f"{s['skipped_already_done']} done before, {s['wall_s']} s -> {s['out']}/{TRAJECTORIES}"
    )


def collect_cmd(
    model: Annotated[
        str,
        typer.Option(
            "--model",
            help="vllm:URL[,URL] | local:DIR | hf:DIR | smollm2 | openai:MODEL@URL | scripted:FILE | a demonstrator: "
            "solver, swe_demonstrator, mini_swe_demonstrator",
        ),
    ],
    env: Annotated[str, typer.Option("--env", help="registered env id, e.g. sao/PythonTool-v0")],
    n: Annotated[int, typer.Option("--n", help="episodes to collect")],
    out: Annotated[Path, typer.Option("--out", help="output folder (rerun to resume)")],
    env_kwargs: Annotated[str, typer.Option("--env-kwargs", help="JSON object of env constructor kwargs")] = "{}",
    tasks: Annotated[
        str | None,
        typer.Option(
            "--tasks", help="task records: arithmetic, arithmetic_chain, aime25, a JSONL/parquet file, a hub id"
        ),
    ] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", help="episodes in flight")] = 4,
    seed: Annotated[int, typer.Option("--seed", help="episode i is reset with seed + i")] = 0,
    max_turns: Annotated[int, typer.Option("--max-turns")] = 8,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="max new tokens per action")] = 256,
    max_context: Annotated[int, typer.Option("--max-context", help="max tokens of an episode")] = 2048,
    temperature: Annotated[float, typer.Option("--temperature")] = 1.0,
    tokenizer: Annotated[
        str | None, typer.Option("--tokenizer", help="tokenizer dir (vllm: specs, demonstrators)")
    ] = None,
    agent: Annotated[
        str, typer.Option("--agent", help="what drives the model: sao (SAO's own loop) or mini-swe-agent")
    ] = "sao",
    agent_config: Annotated[
        str, typer.Option("--agent-config", help="the agent's own config (mini-swe-agent: a config name or YAML)")
    ] = "",
    verbose: Annotated[
        bool, typer.Option("--verbose", help="show third-party output here, not only in OUT/logs/third_party.log")
    ] = False,
) -> None:
    """Roll out a model on an env and write trajectories (for `sao sft --min-reward` and `sao pretrain-value`)."""
    from sao.envs.registration import EnvSetupError
    from sao.eval.common import SPEC_HELP, EvalError

    try:
        kwargs = json.loads(env_kwargs)
        if not isinstance(kwargs, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        typer.echo(
            f"error: --env-kwargs {env_kwargs!r}: {e}; pass a JSON object, e.g. '{{\"max_steps\": 4}}'", err=True
        )
        raise typer.Exit(2) from e
    try:
        cfg = CollectConfig(
            model, env, n, out, kwargs, tasks, concurrency, seed, max_turns, max_tokens, max_context, temperature,
            tokenizer, agent=agent, agent_config=agent_config,
        )  # fmt: skip
        with contextlib.nullcontext() if verbose else third_party_to_log(out / "logs" / "third_party.log"):
            summary = asyncio.run(collect(cfg))
    except (EvalError, EnvSetupError, ValueError, FileNotFoundError) as e:
        typer.echo(f"error: {e}" + (f"\nmodel specs: {SPEC_HELP}" if isinstance(e, EvalError) else ""), err=True)
        raise typer.Exit(2) from e
    typer.echo(summary_line(summary))


def register(app: typer.Typer) -> None:
    app.command("collect")(collect_cmd)
