"""EpisodeRunner's progress line: it counts every episode (the bar closes after the pool drains) and has an ETA."""

from __future__ import annotations

import pytest
from agent_fakes import CharChatMLTokenizer, ScriptedEnv

from sao.agent.engines.scripted import ScriptedEngine
from sao.agent.episodes import EpisodeRunner, RunnerConfig, TokenPlayer, episodes_of
from sao.agent.loop import AgentConfig
from sao.agent.records import Trajectory

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
    assert "turns 6," in lines[-1]  # the runner counted each episode's turn through its player
    assert player.on_turn is None  # and gave the player back as it was
    assert all(len(line) <= 80 for line in lines)


async def test_eta_is_timed_by_turns_while_every_episode_is_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    """32 episodes at once: before any finishes, the ETA comes from the turns done (the quickstart's eval sat at
    ``episodes 0/32`` for 1.5 min and then showed a 45-minute ETA for a stage that ended 50 s later)."""
    import sao.core.console as console
    from sao.agent.episodes import _progress

    clock = [100.0]
    monkeypatch.setattr(console.time, "monotonic", lambda: clock[0])
    prog = _progress(True, 32, max_turns=3, concurrency=32)
    advance = await prog.__aenter__()
    assert prog.bar.eta_s() is None  # nothing done yet: no rate
    clock[0] += 30.0
    advance.turn()
    assert prog.bar.eta_s() is None  # one turn of the first wave: no rate yet (it gave a 51-minute ETA)
    for _ in range(31):  # every episode's first turn, 30 s in
        advance.turn()
    # 32 of 32 x 3 turns in 30 s: 64 turns left at that rate = 60 s (the count-based ETA would still be None)
    assert prog.bar.done == 0 and prog.bar.eta_s() == pytest.approx(60.0)
    clock[0] += 20.0
    for i in range(32):  # second turns; every episode ends after 2 turns
        advance.turn()
        advance(Trajectory(f"t{i}", "env", (), 1.0, "ok", {"turns": 2}))
    # finished episodes took 2 turns each: the expected total is 64, all done
    assert prog.bar.done == 32 and prog.bar.eta_s() == pytest.approx(0.0)
    await prog.__aexit__(None, None, None)


async def test_an_episode_that_ends_during_the_first_wave_gives_no_eta(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen in the main job's eval (64 at once): ``episodes 1/64 1:11<1:14:51`` for a stage that took 3 min; the
    episode count's rate is no better than the turns' before the first wave of turns is over."""
    import sao.core.console as console
    from sao.agent.episodes import _progress

    clock = [100.0]
    monkeypatch.setattr(console.time, "monotonic", lambda: clock[0])
    prog = _progress(True, 64, max_turns=3, concurrency=64)
    advance = await prog.__aenter__()
    clock[0] += 71.0
    for _ in range(4):
        advance.turn()
    advance(Trajectory("early", "env", (), 0.0, "ok", {"turns": 1}))
    assert prog.bar.done == 1 and prog.bar.eta_s() is None and "<?" in prog.bar.render()
    for _ in range(60):  # the first wave done (64 turns): now the turns give the rate
        advance.turn()
    # the one finished episode took 1 turn, but each of the 63 in flight has at least one more: 63 turns at 64 / 71 s
    assert prog.bar.eta_s() == pytest.approx(63 * 71.0 / 64)
    await prog.__aexit__(None, None, None)
