"""The SWE demonstrator in real Docker episodes: every offline task resolved through the env's own tools, the
observations real tool output cut for a small context, the official harness's verdict as the reward."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.docker


@pytest.mark.parametrize("hint", ["", "line"])
def test_the_demonstrator_resolves_every_task_with_real_observations(
    offline_tasks: list[dict[str, Any]], smollm2_dir: Path, hint: str
) -> None:
    from transformers import AutoTokenizer

    from sao.agent.engines.registry import make_demonstrator
    from sao.envs.swe.tasks.instance import with_location_hint

    if hint:  # issues that name the bug's line (the SWE job's task set): viewed there, no grep
        offline_tasks = [with_location_hint(r, hint) for r in offline_tasks]
        # a patch that only adds lines (a removed branch) has no line to name: its issue names the function
        assert any("The bug is on line" in r["problem_statement"] for r in offline_tasks)
    from sao.agent.episodes import EpisodeRunner, RunnerConfig, TokenPlayer, env_factory, episodes_of
    from sao.agent.loop import AgentConfig

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    player = TokenPlayer(make_demonstrator("swe_demonstrator", tok, offline_tasks), tok, AgentConfig(4096, 320, 8))
    make_env = env_factory("sao/SWE-v0", {"max_obs_lines": 12, "pass_to_pass_sample": 4})
    runner = EpisodeRunner(make_env, player, RunnerConfig(2, progress=False))
    got: list[Any] = []
    asyncio.run(runner.run(episodes_of(offline_tasks), on_trajectory=got.append))
    assert len(got) == len(offline_tasks) and all(t.status == "ok" for t in got), [t.info for t in got]
    p2p = {r["instance_id"]: len(r["PASS_TO_PASS"]) for r in offline_tasks}
    for t in got:
        assert t.reward == 1.0 and t.info["solved"]
        assert t.info["report"]["pass_to_pass_sampled"] == min(4, p2p[t.task_id])
        assert [s.kind for s in t.segments][1::2] == ["action"] * t.info["turns"]
        obs = [tok.decode(list(s.token_ids)) for s in t.segments if s.kind == "observation"]
        assert "failed" in obs[0] and "passed" in obs[-1]  # the failing test reproduced, then fixed
        assert all(len(o.splitlines()) <= 12 + 4 for o in obs)  # cut to max_obs_lines (+ the template's lines)
    assert any("lines omitted ..." in tok.decode(list(t.token_ids)) for t in got)
    named = {r["instance_id"] for r in offline_tasks if "The bug is on line" in r["problem_statement"]}
    for t in got:
        if t.task_id in named:  # viewed where the issue says, never grepped: test, view, edit, test, submit
            text = tok.decode(list(t.token_ids))
            assert "grep -rn" not in text and t.info["turns"] == 5, text[-3000:]
