"""Stop requests of a run (trainer.stopping): SIGTERM and a dead vLLM server end the wait for a batch."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from trainer.stopping import EXIT_ENGINE_DIED, EXIT_SIGTERM, StopRequest, next_batch_or_stop


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
    assert got is None and stop.exit_code == EXIT_ENGINE_DIED
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
