"""Clean stops of a training run: SIGTERM, or the run's own vLLM server dying, becomes a stop request that rank 0's
loop honours between steps (checkpoint, close the rollouts, exit non-zero) so that `sao train --resume` continues.

Why a stop and not a restart of the server: episodes fail fast while it is down (each one an infra error), and
starting vLLM again takes about a minute on CPU; a stop loses only the episodes in flight (recorded in
trajectories.jsonl as generated and never trained: the resumed run trains them or counts them as infra errors).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import Any

EXIT_SIGTERM = 128 + signal.SIGTERM
EXIT_ENGINE_DIED = 75  # EX_TEMPFAIL: try again (`sao train --resume`)


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
                EXIT_ENGINE_DIED,
            )


async def next_batch_or_stop(coord: Any, n: int, step: int, stop: StopRequest, server: Any) -> list[Any] | None:
    """``coord.next_batch(n, step)``, or None as soon as a stop is requested (checked every second). A cancelled
    wait loses nothing: trajectories it had taken are in the ledger as generated, and a resume restores them."""
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
    return list(batch.result())
