"""Whole toy runs whose episodes have several rows (issue 44): the real trainer (coordinator, ledger, learner,
DeepSpeed) trains an episode's rows together, within the staleness bound, in whole GRPO groups, under both staleness
policies, asynchronous (sao, grpo_dis) and synchronous (grpo).

The rows come from the real episode runner: every fourth episode is returned as a gateway session with a prefix
break would return it (row 0: its first turn, the history the agent then edited; row 1: the whole episode; both with the
episode's outcome), the pattern (rows 1, 1, 1, 2) that stopped training at step 4 before the episode was the unit.
This is the trainer's side only; an episode through mini-swe-agent is tests/integration/swe/test_swe_mini_smoke.py.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from sao.agent.records import Trajectory

pytestmark = [pytest.mark.deepspeed]
ROOT = Path(__file__).resolve().parents[3]
STEPS, BATCH = 6, 4
SMALL = [
    "env.kwargs={turns: 2, symbols: AB, rule: copy, reward: all}",
    f"run.total_steps={STEPS}", f"trainer.batch_size={BATCH}", "deepspeed.micro_batch_size=2",
    "rollout.concurrency=4", "rollout.buffer_size=8", "trainer.group_size=2", "trainer.critic_warmup_steps=0",
    "trainer.skip_uniform_reward_batches=false", "run.progress=false", "run.plot=false", "run.tensorboard=false",
    f"run.save_every={STEPS}",
]  # fmt: skip


class PrefixBreaks:
    """The real episode runner; episode ``i`` with ``i % 4 == 3`` comes back as two rows, as a gateway session whose
    agent edited its history returns it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __aenter__(self) -> PrefixBreaks:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.inner.__aexit__(*exc)

    async def run_one(self, episode: Any) -> list[Trajectory]:
        rows: list[Trajectory] = await self.inner.run_one(episode)
        (t,) = rows
        if episode.index % 4 != 3 or t.status == "infra_error" or len(t.action_segments) < 2:
            return rows
        first = dataclasses.replace(t, segments=t.segments[:2], info={**t.info, "row": 0, "rows": 2}, timings={})
        return [first, dataclasses.replace(t, info={**t.info, "row": 1, "rows": 2})]


def _ledger(run: Path) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    rows, events = {}, []
    for line in (run / "trajectories.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["type"] == "trajectory":
            rows[rec["uid"]] = rec
        elif rec["type"] == "event":
            events.append(rec)
    return rows, events


@pytest.mark.timeout(300)  # a hang (the coordinator waiting for rows that never come) fails instead of blocking
@pytest.mark.parametrize("policy", ["wait", "drop"])
@pytest.mark.parametrize("algorithm", ["sao", "grpo", "grpo_dis"])
def test_multi_row_episodes_train_whole_within_the_bound(
    tmp_path: Path, deepspeed_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, algorithm: str, policy: str
) -> None:
    from sao.trainer.runs import run as run_mod

    real = run_mod.episode_runner  # type: ignore[attr-defined]
    monkeypatch.setattr(run_mod, "episode_runner", lambda *a, **kw: PrefixBreaks(real(*a, **kw)))
    run = run_mod.train(
        str(ROOT / "configs/toy.yaml"),
        [f"run.dir={tmp_path / 'run'}", f"trainer.algorithm={algorithm}", f"trainer.staleness_policy={policy}", *SMALL],
    )
    rows, events = _ledger(run)
    bound = 0 if algorithm == "grpo" else 2
    steps: dict[int, set[str]] = defaultdict(set)  # step -> episodes trained
    step_of: dict[str, set[int]] = defaultdict(set)  # episode -> the steps that trained its rows
    for ev in (e for e in events if e["event"] == "trained"):
        rec = rows[ev["uid"]]
        versions = [s["policy_version"] for s in rec["trajectory"]["segments"] if s["kind"] == "action"]
        assert ev["version"] - min(versions) <= bound, f"a row trained at lag {ev['version'] - min(versions)}"
        steps[ev["step"]].add(rec["episode"])
        step_of[rec["episode"]].add(ev["step"])
    assert sorted(steps) == list(range(1, STEPS + 1))
    assert all(len(eps) == BATCH for eps in steps.values()), {s: len(e) for s, e in steps.items()}
    by_episode: dict[str, list[str]] = defaultdict(list)
    for uid, rec in rows.items():
        by_episode[rec["episode"]].append(uid)
    trained_rows = {e["uid"] for e in events if e["event"] == "trained"}
    for episode, trained_at in step_of.items():
        assert len(trained_at) == 1 and set(by_episode[episode]) <= trained_rows, "an episode's rows were split"
    if algorithm != "sao":  # whole groups: each step trains both members of each of its groups
        for eps in steps.values():
            groups = [rows[by_episode[e][0]]["trajectory"]["group_id"] for e in eps]
            assert sorted(groups.count(g) for g in set(groups)) == [2, 2], groups
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["batch_episodes"] for m in metrics] == [BATCH] * STEPS
    assert any(m["batch_rows"] > m["batch_episodes"] for m in metrics), "no batch held a multi-row episode"
    assert metrics[-1]["trained_episodes"] == BATCH * STEPS and metrics[-1]["trained_rows"] == len(trained_rows)
    if policy == "wait":
        assert metrics[-1]["dropped_stale"] == 0
