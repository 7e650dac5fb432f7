"""EpisodeRunner: concurrency bound, streaming to callback/queue/JSONL, crashes become infra_error, pause/stop."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent_fakes import CharChatMLTokenizer, ScriptedEnv

from sao.agent.engines.scripted import ScriptedEngine
from sao.agent.episodes import Episode, EpisodeRunner, RunnerConfig, TokenPlayer, episodes_of
from sao.agent.loop import AgentConfig
from sao.agent.records import read_jsonl

TOK = CharChatMLTokenizer()


def runner(factory, engine, concurrency: int, **kw) -> EpisodeRunner:  # type: ignore[no-untyped-def]
    player = TokenPlayer(engine, TOK, AgentConfig())
    return EpisodeRunner(factory, player, RunnerConfig(concurrency, progress=False), **kw)


def endless_episodes():  # type: ignore[no-untyped-def]
    i = 0
    while True:
        yield Episode(i, seed=i)
        i += 1


def two_turn_env(fail: bool = False) -> ScriptedEnv:
    return ScriptedEnv([("o1", 0.0, False, False, {}), ("o2", 1.0, True, False, {})], fail_on_step=0 if fail else None)


class CountingEngine(ScriptedEngine):
    def __init__(self) -> None:
        super().__init__([[*TOK.encode("a"), 2]], delay_s=0.02)
        self.active = self.peak = 0

    async def generate(self, prompt_ids, sampling):  # type: ignore[no-untyped-def]
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            return await super().generate(prompt_ids, sampling)
        finally:
            self.active -= 1


async def test_runs_all_tasks_concurrently_within_the_bound(tmp_path: Path) -> None:
    engine = CountingEngine()
    envs: list[ScriptedEnv] = []

    def factory() -> ScriptedEnv:
        envs.append(two_turn_env())
        return envs[-1]

    seen = []
    worker = runner(factory, engine, 3, out_path=tmp_path / "t.jsonl")
    tasks = [{"task_id": f"t{i}"} for i in range(10)]
    stats = await worker.run(episodes_of(tasks), on_trajectory=seen.append)
    assert stats.episodes == 10 and stats.by_status == {"ok": 10} and stats.reward_sum == 10.0
    assert engine.peak == 3
    assert sorted(t.task_id for t in seen) == sorted(t["task_id"] for t in tasks)
    on_disk = list(read_jsonl(tmp_path / "t.jsonl"))
    assert [t.task_id for t in on_disk] == [t.task_id for t in seen]
    assert all(e.closed for e in envs)
    assert envs[0].reset_kwargs["options"]["task"]["task_id"].startswith("t")
    assert 0.0 <= stats.agent_overhead < 1.0


async def test_a_crashing_episode_becomes_infra_error_and_the_run_goes_on() -> None:
    n = {"i": 0}

    def factory() -> ScriptedEnv:
        n["i"] += 1
        return two_turn_env(fail=n["i"] == 2)

    q: asyncio.Queue = asyncio.Queue()
    worker = runner(factory, ScriptedEngine([[40, 2]]), 1)
    stats = await worker.run(episodes_of(range(4)), on_trajectory=q)
    assert stats.by_status == {"ok": 3, "infra_error": 1}
    bad = [t for t in (q.get_nowait() for _ in range(4)) if t.status == "infra_error"]
    assert "scripted env crash" in bad[0].info["infra_error"] and bad[0].segments == ()


async def test_pause_holds_new_episodes_and_stop_ends_an_endless_stream() -> None:
    worker = runner(two_turn_env, ScriptedEngine([[40, 2]], delay_s=0.01), 2)
    got: list = []
    run = asyncio.create_task(worker.run(endless_episodes(), on_trajectory=got.append))
    while len(got) < 4:
        await asyncio.sleep(0.005)
    worker.pause()
    await asyncio.sleep(0.2)  # episodes in flight finish
    n = len(got)
    await asyncio.sleep(0.2)
    assert len(got) == n  # nothing new started while paused
    worker.resume()
    while len(got) < n + 2:
        await asyncio.sleep(0.005)
    worker.stop()
    stats = await asyncio.wait_for(run, timeout=10)
    assert stats.episodes >= n + 2


async def test_a_failing_callback_stops_the_run_and_raises() -> None:
    def boom(t) -> None:  # type: ignore[no-untyped-def]
        raise OSError("disk full")

    worker = runner(two_turn_env, ScriptedEngine([[40, 2]]), 1)
    try:
        await worker.run(episodes_of(range(5)), on_trajectory=boom)
    except OSError as e:
        assert "disk full" in str(e)
    else:
        raise AssertionError("the callback error was swallowed")


async def test_a_sample_of_episodes_is_checked_for_render_drift_and_records_are_stamped() -> None:
    player = TokenPlayer(ScriptedEngine([[40, 2]]), TOK, AgentConfig(), render_check_every=2)
    worker = EpisodeRunner(two_turn_env, player, RunnerConfig(2, progress=False))
    got: list = []
    await worker.run(episodes_of(range(5)), on_trajectory=got.append)
    checked = sorted(t.info["episode"] for t in got if "render_drift" in t.info)
    assert checked == [0, 2, 4] and all(t.info["render_drift"] == 0.0 for t in got if "render_drift" in t.info)
    assert sorted(t.info["seed"] for t in got) == [0, 1, 2, 3, 4]


async def test_a_cancelled_run_cancels_its_episodes_and_closes_their_envs() -> None:
    """Ctrl-C / SIGTERM cancel ``sao``'s main task: the runner must stop its episodes (their envs closed), not wait
    for them to finish (the engine here would take 60 s a turn)."""
    envs: list[ScriptedEnv] = []

    def factory() -> ScriptedEnv:
        envs.append(two_turn_env())
        return envs[-1]

    worker = runner(factory, ScriptedEngine([[40, 2]], delay_s=60.0), 3)
    run = asyncio.ensure_future(worker.run(episodes_of(range(3))))
    while len(envs) < 3:
        await asyncio.sleep(0.01)
    t0 = asyncio.get_running_loop().time()
    run.cancel()
    try:
        await run
    except asyncio.CancelledError:
        pass
    assert asyncio.get_running_loop().time() - t0 < 5.0
    assert len(envs) == 3 and all(e.closed for e in envs)
