"""The one retry helper (sao.core.retry): tries only on TryAgain, counts its tries, waits by deadline when polling."""

from __future__ import annotations

import asyncio
import time

import pytest

from sao.core.retry import RetryError, TryAgain, backoff, poll_until


async def _until_ok(fail: int, tries: int, calls: list[int]) -> str:
    async for attempt in backoff(tries, 0.001):
        with attempt:
            calls.append(1)
            if len(calls) <= fail:
                raise TryAgain
            return "ok"
    raise AssertionError("backoff ended without a result or a RetryError")


async def test_backoff_tries_again_only_when_asked_and_stops_at_the_count() -> None:
    calls: list[int] = []
    assert await _until_ok(2, 3, calls) == "ok" and len(calls) == 3
    calls.clear()
    with pytest.raises(RetryError):
        await _until_ok(5, 3, calls)
    assert len(calls) == 3

    calls.clear()
    with pytest.raises(KeyError):  # any other error ends the loop at once
        async for attempt in backoff(5, 0.001):
            with attempt:
                calls.append(1)
                raise KeyError("x")
    assert len(calls) == 1


async def test_backoff_passes_cancellation_through() -> None:
    calls: list[int] = []

    async def slow() -> None:
        async for attempt in backoff(5, 10.0):  # the wait after the first try would be 10 s
            with attempt:
                calls.append(1)
                raise TryAgain

    task = asyncio.create_task(slow())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(calls) == 1


def test_poll_until_retries_what_it_accepts_until_the_deadline() -> None:
    calls: list[float] = []

    def gone() -> None:
        calls.append(time.monotonic())
        raise ConnectionError("daemon gone")

    t0 = time.monotonic()
    with pytest.raises(RetryError) as err:
        poll_until(0.3, 0.05, lambda e: isinstance(e, ConnectionError))(gone)
    assert 0.3 <= time.monotonic() - t0 < 2 and len(calls) >= 3
    assert isinstance(err.value.last_attempt.exception(), ConnectionError)
    calls.clear()
    with pytest.raises(ConnectionError):  # not accepted: raised as it is, no second try
        poll_until(5, 0.05, lambda e: False)(gone)
    assert len(calls) == 1
    calls.clear()
    with pytest.raises(ConnectionError):  # reraise: past the deadline the call's own error, not RetryError
        poll_until(0.2, 0.05, lambda e: isinstance(e, ConnectionError), reraise=True)(gone)
    assert len(calls) >= 3
