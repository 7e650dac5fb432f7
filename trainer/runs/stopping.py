"""Clean stops of a training run: SIGTERM, the run's own vLLM server dying, the servers of ``rollout.vllm_urls``
not answering, or the rollout side gone (nothing but infra errors for a long stretch) becomes a stop request that
rank 0's loop honours between steps (checkpoint, close the rollouts, every rank exits non-zero) so that
`sao train --resume` continues.

Why a stop and not a restart of the server: episodes fail fast while it is down (each one an infra error), and
starting vLLM again takes about a minute on CPU; a stop loses only the episodes in flight (recorded in
trajectories.jsonl as generated and never trained: the resumed run trains them or counts them as infra errors).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

EXIT_SIGTERM = 128 + signal.SIGTERM
EXIT_RESUMABLE = 75  # EX_TEMPFAIL: the run's parts failed, not the run; try again (`sao train --resume`)


class StopRequest:
    """The first reason to stop, and the process exit code that goes with it."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.exit_code = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def request(self, reason: str, exit_code: int) -> None:
        if self.reason is None:
            self.reason, self.exit_code = reason, exit_code

    def install(self) -> None:
        """Turn SIGTERM into a stop request (in the running event loop; removed by ``uninstall``)."""
        self._loop = asyncio.get_running_loop()
        self._loop.add_signal_handler(signal.SIGTERM, self.request, "SIGTERM received", EXIT_SIGTERM)

    def uninstall(self) -> None:
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_signal_handler(signal.SIGTERM)
            self._loop = None

    def check_server(self, server: Any) -> None:
        """Request a stop when ``server`` (a ``LocalVLLMServer`` the run started, or None) has exited."""
        if server is not None and not server.alive():
            self.request(
                f"the run's vLLM server exited (code {server.proc.returncode}; log {server.log_path})",
                EXIT_RESUMABLE,
            )


class RolloutsLost(RuntimeError):
    """The rollout side is gone: raised by the coordinator while the trainer waits for a batch (see
    ``InfraStreak``); ``next_batch_or_stop`` turns it into a stop request with exit 75."""


class InfraStreak:
    """The rule for "the rollout side is gone": every episode that ended for ``stall_s`` seconds was an infra error,
    and at least ``min_errors`` of them in a row (rollout workers dead, an engine or a Docker daemon that cannot
    serve). Both are needed: a burst of fast failures (a server restarting for a few seconds) is not a stall, nor is
    one slow episode failing after a quiet stretch. ``stall_s`` 0: never.

    Fed the coordinator's running counts (``observe``); a trainable trajectory between two observations resets the
    streak, so the streak counted can only be shorter, and start later, than the true one."""

    def __init__(self, stall_s: float, min_errors: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_s, self.min_errors, self.clock = stall_s, min_errors, clock
        self._ok: int | None = None  # trainable trajectories seen at the last observation
        self._base = 0  # infra errors before the streak
        self._since: float | None = None  # when the streak's first error was seen

    def observe(self, generated: int, infra_error: int) -> str | None:
        """The reason to stop, or None."""
        now, ok = self.clock(), generated - infra_error
        if ok != self._ok:
            self._ok, self._base, self._since = ok, infra_error, None
        streak = infra_error - self._base
        if streak and self._since is None:
            self._since = now
        if not self.stall_s or self._since is None or streak < self.min_errors or now - self._since < self.stall_s:
            return None
        return (
            f"the rollout side is gone: the last {streak} episodes, over {now - self._since:.0f} s "
            f"(rollout.infra_stall_s={self.stall_s:g}), all ended in an infra error"
        )


class ServerWatch:
    """Watches servers the run did not start (``rollout.vllm_urls``) as ``check_server`` watches its own: ``GET
    /health`` on each every ``interval_s``; when none has answered (HTTP 200) for longer than ``grace_s`` it
    requests a stop (exit 75) naming them. A server that hangs (accepts, never answers) counts as unreachable once
    the health request times out."""

    def __init__(self, urls: Sequence[str], grace_s: float, stop: StopRequest) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.grace_s, self.stop = grace_s, stop
        self.interval_s = min(5.0, max(0.25, grace_s / 4))
        self.errors: dict[str, str] = {}
        self._last_ok = time.monotonic()  # the run starts with its servers assumed up: a dead one stops it at grace
        self._task: asyncio.Task[None] | None = None

    async def poll(self) -> bool:
        """One round of health checks; True if some server answered."""
        import httpx

        async def one(client: httpx.AsyncClient, url: str) -> bool:
            try:
                resp = await client.get(url + "/health")
            except httpx.HTTPError as e:
                self.errors[url] = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                return False
            if resp.status_code != 200:
                self.errors[url] = f"HTTP {resp.status_code}"
                return False
            self.errors.pop(url, None)
            return True

        async with httpx.AsyncClient(timeout=max(1.0, min(5.0, self.interval_s))) as client:
            up = any(await asyncio.gather(*(one(client, u) for u in self.urls)))
        if up:
            self._last_ok = time.monotonic()
        return up

    def _request(self, why: str) -> None:
        errors = "; ".join(f"{u}: {self.errors.get(u, '?')}" for u in self.urls)
        self.stop.request(
            f"{why} the vLLM servers of rollout.vllm_urls {self.urls} ({errors}); restart them and resume",
            EXIT_RESUMABLE,
        )

    async def _run(self) -> None:
        while self.stop.reason is None:
            await self.poll()
            down = time.monotonic() - self._last_ok
            if down > self.grace_s:
                self._request(f"for {down:.0f} s (rollout.server_grace_s={self.grace_s:g}) nothing answered from")
                return
            await asyncio.sleep(self.interval_s)

    async def check_now(self) -> None:
        """After a failed weight sync: stop at once if no server answers now (the run cannot go on without them)."""
        if not await self.poll():
            self._request("a weight sync failed and nothing answers now from")

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


async def next_batch_or_stop(coord: Any, n: int, step: int, stop: StopRequest, server: Any) -> list[Any] | None:
    """``coord.next_batch(n, step)``, or None as soon as a stop is requested (checked every second) or the
    coordinator finds the rollout side gone (``RolloutsLost``). A cancelled wait loses nothing: trajectories it had
    taken are in the ledger as generated, and a resume restores them."""
    stop.check_server(server)
    if stop.reason is not None:
        return None
    batch = asyncio.ensure_future(coord.next_batch(n, step))
    while not batch.done():
        await asyncio.wait({batch}, timeout=1.0)
        stop.check_server(server)
        if stop.reason is not None and not batch.done():
            batch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await batch
            return None
    try:
        return list(batch.result())
    except RolloutsLost as e:
        stop.request(str(e), EXIT_RESUMABLE)
        return None
