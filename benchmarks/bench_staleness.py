"""`sao bench staleness`: the staleness bound held by waiting (admission control) vs by dropping, on a run's episodes.

Both policies of ``trainer.staleness_policy`` run the real rollout coordinator (``sao.trainer.rollout.pipeline``) and
its ledger; what is replayed is the run's own episodes: each episode of the given trajectories file (e.g. the SWE
job's RL stage ledger) comes back after its recorded wall time (``timings.total_s``) with its recorded length, and
the trainer takes ``batch_size`` of them per step and spends the run's own step time (the median ``step_s`` of the
``metrics.jsonl`` beside the file, or ``--step-s``). Clocks run ``speedup`` times faster than the run's, so the
replay of a 40-step run takes seconds; no model runs, only the scheduling is measured, which is what decides
which episodes train.

Reported per setting (concurrency, buffer, ``max_staleness``) and policy: episodes finished, trained, dropped as
stale, the mean and 90th-percentile length (tokens) of the trained episodes against all finished ones, the share
dropped among the longest and the shortest quarter of the finished episodes (a length bias shows up as a gap), the
largest lag trained and the trainer's idle share (waiting for a batch). A plot compares the length distributions.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sao.benchmarks.rl_bench_common import print_table, write_json

POLICIES = ("wait", "drop")


@dataclass(frozen=True)
class Setting:
    concurrency: int
    buffer_size: int
    max_staleness: int

    @classmethod
    def parse(cls, text: str) -> Setting:
        """``CONCURRENCY:BUFFER:MAX_STALENESS``, e.g. ``4:4:2``."""
        parts = text.split(":")
        try:
            c, b, s = (int(p) for p in parts)
        except ValueError:
            raise ValueError(
                f"--settings: {text!r} is not CONCURRENCY:BUFFER:MAX_STALENESS (three integers, e.g. 4:4:2)"
            ) from None
        if c < 1 or b < 1 or s < 0:
            raise ValueError(f"--settings: {text!r}: concurrency and buffer must be >= 1, max_staleness >= 0")
        return cls(c, b, s)

    @property
    def label(self) -> str:
        return f"concurrency {self.concurrency}, buffer {self.buffer_size}, max_staleness {self.max_staleness}"


@dataclass(frozen=True)
class StalenessBenchConfig:
    out: Path
    trajectories: Path
    """A JSONL of trajectories with ``timings.total_s`` (a run's ``trajectories.jsonl``): the episodes replayed."""
    settings: tuple[Setting, ...] = (Setting(4, 4, 2), Setting(16, 16, 1))
    batch_size: int = 4
    step_s: float = 0.0
    """The trainer's seconds per step; 0: the median ``step_s`` of ``metrics.jsonl`` beside the trajectories."""
    steps: int = 40
    speedup: float = 500.0
    seed: int = 0


@dataclass
class Episodes:
    """The recorded episodes: (wall seconds, tokens), replayed in a seeded random order, cycling."""

    records: list[tuple[float, int]]
    seed: int = 0
    order: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.order = list(range(len(self.records)))
        random.Random(self.seed).shuffle(self.order)

    def pick(self, index: int) -> tuple[float, int]:
        return self.records[self.order[index % len(self.order)]]


class Replay:
    """An episode source for the coordinator: episode ``i`` sleeps its recorded time (sped up) and returns a
    trajectory whose action carries the coordinator's version at its start and whose ``info['tokens']`` is the
    recorded length."""

    def __init__(self, episodes: Episodes, speedup: float) -> None:
        from sao.trainer.rollout.pipeline import Coordinator

        self.episodes, self.speedup = episodes, speedup
        self.coord: Coordinator | None = None

    async def run_one(self, episode: Any) -> Any:
        from sao.agent.records import Segment, Trajectory

        assert self.coord is not None
        version = self.coord.version
        wall_s, tokens = self.episodes.pick(episode.index)
        await asyncio.sleep(wall_s / self.speedup)
        segs = (Segment("prompt", (1,)), Segment("action", (2,), (-0.5,), version, 0.0))
        return Trajectory(f"replay-{episode.index}", "replay", segs, 0.0, info={"tokens": tokens})


def read_episodes(path: Path) -> list[tuple[float, int]]:
    """(total_s, tokens) of every trainable episode in ``path``; refuses a file without wall times."""
    from sao.trainer.learn.value_pretrain import read_rollouts

    out = [(float(t.timings.get("total_s") or 0.0), t.num_tokens) for t in read_rollouts(path)]
    out = [(s, n) for s, n in out if s > 0]
    if len(out) < 2:
        raise ValueError(
            f"{path}: {len(out)} episodes with a recorded wall time (timings.total_s); the replay needs 2 or more "
            "(pass a run's trajectories.jsonl)"
        )
    return out


def run_step_s(path: Path) -> float:
    """The median trainer step time of the run whose ledger is ``path`` (its ``metrics.jsonl``)."""
    from sao.core.jsonl import iter_jsonl

    metrics = path.parent / "metrics.jsonl"
    if not metrics.is_file():
        raise ValueError(f"no {metrics} beside the trajectories to read the step time from; pass --step-s")
    times = [float(r["step_s"]) for _, r in iter_jsonl(metrics) if isinstance(r, dict) and r.get("step_s")]
    if not times:
        raise ValueError(f"{metrics} has no step_s; pass --step-s")
    return statistics.median(times)


def _quantile(xs: list[int], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return float(s[min(len(s) - 1, int(q * len(s)))])


def length_bias(finished: list[int], trained: list[int], dropped: list[int]) -> dict[str, Any]:
    """Length statistics of trained vs finished episodes and the share dropped in the longest and shortest
    quarters of the finished ones (by length; ties count in both quarters they straddle)."""
    lo, hi = _quantile(finished, 0.25), _quantile(finished, 0.75)

    def share_dropped(pred: Callable[[int], bool]) -> float:
        n = sum(1 for x in finished if pred(x))
        return sum(1 for x in dropped if pred(x)) / n if n else 0.0

    mean = statistics.fmean
    return {
        "finished": len(finished),
        "trained": len(trained),
        "dropped": len(dropped),
        "mean_tokens_finished": mean(finished) if finished else 0.0,
        "mean_tokens_trained": mean(trained) if trained else 0.0,
        "p90_tokens_finished": _quantile(finished, 0.9),
        "p90_tokens_trained": _quantile(trained, 0.9),
        "dropped_share_longest_quarter": share_dropped(lambda x: x >= hi),
        "dropped_share_shortest_quarter": share_dropped(lambda x: x <= lo),
    }


async def replay_one(cfg: StalenessBenchConfig, setting: Setting, policy: str, step_s: float,
                     records: list[tuple[float, int]], ledger: Path) -> dict[str, Any]:  # fmt: skip
    """One policy at one setting: ``cfg.steps`` trainer steps on the real coordinator."""
    from sao.trainer.rollout.ledger import Ledger, replay
    from sao.trainer.rollout.pipeline import Coordinator, TaskSource

    episodes = Episodes(records, cfg.seed)
    source = Replay(episodes, cfg.speedup)
    coord = Coordinator(
        source, TaskSource(None, cfg.seed), Ledger(ledger), concurrency=setting.concurrency,
        buffer_size=setting.buffer_size, max_staleness=setting.max_staleness, staleness_policy=policy,
        batch_size=cfg.batch_size,
    )  # fmt: skip
    source.coord = coord
    lags: list[int] = []
    idle = 0.0
    t0 = time.perf_counter()
    coord.start()
    try:
        for step in range(1, cfg.steps + 1):
            w0 = time.perf_counter()
            items = await asyncio.wait_for(coord.next_batch(cfg.batch_size, step), 600)
            idle += time.perf_counter() - w0
            lags += [coord.lag(i) for i in items]
            coord.trained(items, step)
            await asyncio.sleep(step_s / cfg.speedup)
            coord.version += 1
    finally:
        await coord.stop()
        coord.ledger.close()
    wall = time.perf_counter() - t0
    acc, _ = replay(ledger)
    if not acc.balanced() or acc.double_trained:
        raise RuntimeError(f"the ledger of the {policy} replay does not balance: {acc}")
    finished, trained, dropped = ledger_lengths(ledger)
    out = length_bias(finished, trained, dropped)
    out.update(
        policy=policy, setting=asdict(setting), max_lag=max(lags, default=0), idle_share=idle / wall if wall else 0.0,
        run_time_s=wall * cfg.speedup, ledger_dropped=acc.dropped_stale, finished_tokens=finished,
        trained_tokens=trained,
    )  # fmt: skip
    return out


def ledger_lengths(ledger: Path) -> tuple[list[int], list[int], list[int]]:
    """Recorded lengths of the episodes that finished, were trained and were dropped, read back from the ledger
    (every finished episode is written on arrival, its fate as an event)."""
    from sao.core.jsonl import iter_jsonl

    tokens: dict[str, int] = {}
    fate: dict[str, list[int]] = {"trained": [], "dropped_stale": []}
    for _, rec in iter_jsonl(ledger):
        if rec.get("type") == "trajectory":
            tokens[rec["uid"]] = int(rec["trajectory"]["info"]["tokens"])
        elif rec.get("type") == "event" and rec.get("event") in fate:
            fate[rec["event"]].append(tokens[rec["uid"]])
    return list(tokens.values()), fate["trained"], fate["dropped_stale"]


def _check(cfg: StalenessBenchConfig) -> None:
    if cfg.batch_size < 1 or cfg.steps < 1 or cfg.speedup <= 0 or cfg.step_s < 0:
        raise ValueError("--batch-size and --steps must be >= 1, --speedup > 0 and --step-s >= 0")
    if not cfg.settings:
        raise ValueError("--settings: give at least one CONCURRENCY:BUFFER:MAX_STALENESS")
    if not cfg.trajectories.is_file():
        raise FileNotFoundError(f"{cfg.trajectories} not found; pass a run's trajectories.jsonl")


def run(cfg: StalenessBenchConfig, echo: Callable[[str], None] = print) -> dict[str, Any]:
    _check(cfg)
    records = read_episodes(cfg.trajectories)
    step_s = cfg.step_s or run_step_s(cfg.trajectories)
    secs = sorted(s for s, _ in records)
    echo(
        f"replaying {len(records)} episodes of {cfg.trajectories} (wall {secs[0]:.0f}-{secs[-1]:.0f} s, median "
        f"{statistics.median(secs):.0f} s) against a {step_s:.0f}-s trainer step, {cfg.steps} steps of "
        f"{cfg.batch_size}, {cfg.speedup:g}x faster than real time; load average {os.getloadavg()[0]:.1f}"
    )
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, setting in enumerate(cfg.settings):
            for policy in POLICIES:
                res = asyncio.run(replay_one(cfg, setting, policy, step_s, records, Path(tmp) / f"{k}_{policy}.jsonl"))
                rows.append(res)
                echo(f"  {setting.label}, {policy}: {res['trained']} trained, {res['dropped']} dropped")
    report = {
        "config": {**asdict(cfg), "out": str(cfg.out), "trajectories": str(cfg.trajectories), "step_s": step_s},
        "episodes": len(records),
        "load_avg_end": os.getloadavg()[0],
        "rows": rows,
    }
    cfg.out.mkdir(parents=True, exist_ok=True)
    write_json(cfg.out / "staleness.json", report)
    _table(rows, echo)
    _plot(cfg, rows, records)
    echo(f"wrote {cfg.out / 'staleness.json'} and {cfg.out / 'staleness.png'}")
    return report


def _table(rows: list[dict[str, Any]], echo: Callable[[str], None]) -> None:
    head = ["setting (conc:buf:stale)", "policy", "finished", "trained", "dropped", "mean tokens fin / trained",
            "p90 fin / trained", "dropped: longest / shortest quarter", "max lag", "trainer idle"]  # fmt: skip
    body = []
    for r in rows:
        s = r["setting"]
        body.append([
            f"{s['concurrency']}:{s['buffer_size']}:{s['max_staleness']}", r["policy"], r["finished"], r["trained"],
            r["dropped"], f"{r['mean_tokens_finished']:.0f} / {r['mean_tokens_trained']:.0f}",
            f"{r['p90_tokens_finished']:.0f} / {r['p90_tokens_trained']:.0f}",
            f"{r['dropped_share_longest_quarter']:.2f} / {r['dropped_share_shortest_quarter']:.2f}",
            r["max_lag"], f"{r['idle_share']:.2f}",
        ])  # fmt: skip
    print_table(head, [[str(c) for c in row] for row in body], echo)


def _plot(cfg: StalenessBenchConfig, rows: list[dict[str, Any]], records: list[tuple[float, int]]) -> None:
    """Per setting (rows) and policy (columns): the length histogram of the finished vs the trained episodes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(cfg.settings)
    fig, axes = plt.subplots(n, len(POLICIES), figsize=(10, 3.2 * n), squeeze=False)
    bins = sorted({int(x) for x in _edges([t for _, t in records])})
    for k, r in enumerate(rows):
        ax = axes[k // len(POLICIES)][k % len(POLICIES)]
        ax.hist(r["finished_tokens"], bins=bins, color="0.7", label="finished")
        ax.hist(r["trained_tokens"], bins=bins, histtype="step", color="tab:blue", linewidth=2, label="trained")
        s = r["setting"]
        ax.set_title(f"{r['policy']} ({s['concurrency']}:{s['buffer_size']}:{s['max_staleness']}): "
                     f"{r['trained']} trained, {r['dropped']} dropped", fontsize=9)  # fmt: skip
        ax.set_xlabel("tokens per episode")
        ax.legend(fontsize=8)
    fig.suptitle(f"replay of {len(records)} recorded episodes (concurrency:buffer:max_staleness)", fontsize=9)
    fig.tight_layout()
    fig.savefig(cfg.out / "staleness.png", dpi=110)
    plt.close(fig)


def _edges(xs: list[int], n: int = 16) -> list[float]:
    lo, hi = min(xs), max(xs) + 1
    return [lo + (hi - lo) * i / n for i in range(n + 1)]
