"""Stop requests of a run (trainer.runs.stopping): SIGTERM, a dead vLLM server, given servers that stop answering and
a rollout side that only returns infra errors end the wait for a batch."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from sao.agent.episodes import infra_error_trajectory
from sao.agent.records import Segment, Trajectory
from sao.trainer.rollout.ledger import Ledger, replay
from sao.trainer.rollout.pipeline import Coordinator, TaskSource
from sao.trainer.runs.stopping import (
    EXIT_RESUMABLE,
    EXIT_SIGTERM,
    InfraStreak,
    RolloutsLost,
    ServerWatch,
    StopRequest,
    next_batch_or_stop,
)


class SlowCoordinator:
    """next_batch never finishes on its own (no episode completes); records whether it was cancelled."""

    def __init__(self) -> None:
        self.cancelled = False

    async def next_batch(self, n: int, step: int) -> list[Any]:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return []


class FakeServer:
    def __init__(self) -> None:
        self.up = True
        self.proc = type("P", (), {"returncode": -9})()
        self.log_path = Path("vllm.log")

    def alive(self) -> bool:
        return self.up


def test_sigterm_ends_the_wait_with_its_exit_code() -> None:
    async def run() -> tuple[Any, StopRequest, SlowCoordinator]:
        stop, coord = StopRequest(), SlowCoordinator()
        stop.install()
        try:
            asyncio.get_running_loop().call_later(0.2, os.kill, os.getpid(), signal.SIGTERM)
            got = await asyncio.wait_for(next_batch_or_stop(coord, 4, 1, stop, None), 10)
        finally:
            stop.uninstall()
        return got, stop, coord

    got, stop, coord = asyncio.run(run())
    assert got is None and coord.cancelled
    assert stop.reason == "SIGTERM received" and stop.exit_code == EXIT_SIGTERM == 143
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # uninstalled


def test_a_dead_server_ends_the_wait_and_names_its_log() -> None:
    async def run() -> tuple[Any, StopRequest]:
        stop, server = StopRequest(), FakeServer()
        asyncio.get_running_loop().call_later(0.2, setattr, server, "up", False)
        got = await asyncio.wait_for(next_batch_or_stop(SlowCoordinator(), 4, 1, stop, server), 10)
        return got, stop

    got, stop = asyncio.run(run())
    assert got is None and stop.exit_code == EXIT_RESUMABLE
    assert stop.reason is not None and "vLLM server exited (code -9" in stop.reason and "vllm.log" in stop.reason


def test_a_batch_that_arrives_is_returned_and_the_first_reason_wins() -> None:
    class Ready:
        async def next_batch(self, n: int, step: int) -> list[int]:
            return list(range(n))

    stop = StopRequest()
    assert asyncio.run(next_batch_or_stop(Ready(), 3, 1, stop, FakeServer())) == [0, 1, 2]
    stop.request("first", 1)
    stop.request("second", 2)
    assert (stop.reason, stop.exit_code) == ("first", 1)
    assert asyncio.run(next_batch_or_stop(Ready(), 3, 1, stop, None)) is None


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_infra_streak_needs_both_the_count_and_the_time() -> None:
    clock = Clock()
    streak = InfraStreak(60.0, 4, clock)
    assert streak.observe(10, 0) is None  # ten good episodes
    assert streak.observe(20, 10) is None  # a burst of ten fast failures: the streak starts now (t=0)
    clock.t = 59.0
    assert streak.observe(20, 10) is None  # not yet 60 s
    clock.t = 61.0
    reason = streak.observe(21, 11)
    assert reason is not None and "last 11 episodes" in reason and "rollout.infra_stall_s=60" in reason
    # a good episode resets it: three more failures over 100 s are not enough (count 3 < 4)
    assert streak.observe(22, 11) is None
    assert streak.observe(25, 14) is None
    clock.t = 200.0
    assert streak.observe(25, 14) is None
    assert streak.observe(26, 15) is not None  # the 4th, 139 s after the streak's first
    assert InfraStreak(0.0, 1, clock).observe(5, 5) is None  # 0: never


def _ok(version: int) -> Trajectory:
    return Trajectory("t", "scripted", (Segment("prompt", (1,)), Segment("action", (2,), (-0.5,), version, 1.0)), 1.0)


class GoneAfter:
    """Episodes that succeed until ``n`` were played, then fail as infra errors (a rollout side that went away)."""

    def __init__(self, n: int) -> None:
        self.n, self.played = n, 0

    async def run_one(self, episode: Any) -> Trajectory:
        self.played += 1
        await asyncio.sleep(0.005)
        if self.played <= self.n:
            return _ok(0)
        return infra_error_trajectory("t", "scripted", "no live rollout worker left", with_traceback=False)


async def test_a_rollout_side_gone_after_working_stops_the_run_with_exit_75(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "trajectories.jsonl")
    coord = Coordinator(GoneAfter(6), TaskSource(None, 0), ledger, concurrency=2, buffer_size=4, max_staleness=1,
                        infra_stall_s=0.3)  # fmt: skip
    coord.start()
    stop = StopRequest()
    try:
        first = await next_batch_or_stop(coord, 4, 1, stop, None)
        assert first is not None and len(first) == 4
        coord.trained(first, 1)
        coord.version = 1
        got = await asyncio.wait_for(next_batch_or_stop(coord, 4, 2, stop, None), 20)
    finally:
        await coord.stop()
        ledger.close()
    assert got is None and stop.exit_code == EXIT_RESUMABLE
    assert stop.reason is not None and "rollout side is gone" in stop.reason and "no live rollout worker" in stop.reason
    assert coord.counters.infra_error >= 16  # max(16, 2 x concurrency) in a row
    acc, _ = replay(tmp_path / "trajectories.jsonl")
    assert acc.balanced() and acc.trained == 4


async def test_nothing_but_infra_errors_from_the_start_is_a_setup_error_not_a_stop(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "trajectories.jsonl")
    coord = Coordinator(GoneAfter(0), TaskSource(None, 0), ledger, concurrency=2, buffer_size=4, max_staleness=1,
                        infra_stall_s=0.3)  # fmt: skip
    coord.start()
    try:
        with pytest.raises(RuntimeError, match="every one of the") as e:
            await asyncio.wait_for(next_batch_or_stop(coord, 4, 1, StopRequest(), None), 20)
        assert not isinstance(e.value, RolloutsLost)
    finally:
        await coord.stop()
        ledger.close()


class Health(BaseHTTPRequestHandler):
    up = True

    def do_GET(self) -> None:
        self.send_response(200 if self.up and self.path == "/health" else 503)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def health_server() -> Iterator[tuple[str, type[Health]]]:
    handler = type("H", (Health,), {"up": True})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


async def test_given_servers_that_stop_answering_stop_the_run_after_the_grace(
    health_server: tuple[str, type[Health]], tmp_path: Path
) -> None:
    url, handler = health_server
    dead = "http://127.0.0.1:9"  # nothing listens there: one server down from the start is not a stop
    stop = StopRequest()
    watch = ServerWatch([url, dead], 1.0, stop)
    watch.start()
    try:
        await asyncio.sleep(1.5)
        assert stop.reason is None  # the other one answers
        handler.up = False
        t0 = asyncio.get_running_loop().time()
        got = await asyncio.wait_for(next_batch_or_stop(SlowCoordinator(), 4, 1, stop, None), 10)
        waited = asyncio.get_running_loop().time() - t0
    finally:
        await watch.close()
    assert got is None and stop.exit_code == EXIT_RESUMABLE
    assert 0.9 <= waited < 5, waited
    assert stop.reason is not None and url in stop.reason and dead in stop.reason and "HTTP 503" in stop.reason
    assert "rollout.server_grace_s=1" in stop.reason


async def test_a_failed_sync_with_no_server_answering_stops_at_once(health_server: tuple[str, type[Health]]) -> None:
    url, handler = health_server
    stop = StopRequest()
    watch = ServerWatch([url], 600.0, stop)
    await watch.check_now()
    assert stop.reason is None
    handler.up = False
    await watch.check_now()
    assert stop.exit_code == EXIT_RESUMABLE and stop.reason is not None and "weight sync failed" in stop.reason
