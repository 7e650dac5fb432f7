"""EpisodeRunner's progress line: it counts every episode (the bar closes after the pool drains) and has an ETA."""

from __future__ import annotations

import pytest
from agent_fakes import CharChatMLTokenizer, ScriptedEnv

from agent.engines.scripted import ScriptedEngine
from agent.loop import AgentConfig
from agent.rollout import EpisodeRunner, RunnerConfig, TokenPlayer, episodes_of

TOK = CharChatMLTokenizer()


async def test_the_progress_line_counts_every_episode(capsys: pytest.CaptureFixture[str]) -> None:
    engine = ScriptedEngine([[*TOK.encode("a"), 2]], delay_s=0.01)
    player = TokenPlayer(engine, TOK, AgentConfig())

    def factory() -> ScriptedEnv:
        return ScriptedEnv([("o1", 1.0, True, False, {})])

    runner = EpisodeRunner(factory, player, RunnerConfig(4, progress=True))
    await runner.run(episodes_of([{"task_id": f"t{i}"} for i in range(6)]))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("episodes 0/6 [----------]") and lines[0].endswith("<?")
    assert lines[-1].startswith("episodes 6/6 [##########]") and "mean reward 1.000" in lines[-1]
    assert all(len(line) <= 80 for line in lines)
