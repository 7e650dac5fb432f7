"""Retries, one way: the two policies the product uses, on tenacity (a dependency of swebench, listed as ours).

``backoff`` is for requests to a server that may be restarting (the engines): a few tries, waits doubling from
``base_s`` plus up to ``base_s`` of jitter (clients that failed together do not come back together). An attempt asks
for another by raising ``tenacity.TryAgain``; any other exception, cancellation included, ends the loop at once, and
the last try failing raises ``tenacity.RetryError``, so the caller writes its own message from what it saw.
``poll_until`` is for waiting on a daemon to come back: the same call again every ``every_s`` seconds while the error
is one ``retry_if`` accepts, until ``deadline_s`` has passed (then ``RetryError``, whose ``last_attempt`` holds it;
with ``reraise=True`` the last error itself, for a caller whose callers expect the call's own exception).
"""

from __future__ import annotations

from collections.abc import Callable

import tenacity
from tenacity import RetryError, TryAgain

__all__ = ["RetryError", "TryAgain", "backoff", "poll_until"]


def backoff(tries: int, base_s: float, max_wait_s: float = 30.0) -> tenacity.AsyncRetrying:
    """``async for attempt in backoff(3, 0.5): with attempt: ...``: at most ``tries`` attempts, only on ``TryAgain``."""
    return tenacity.AsyncRetrying(
        stop=tenacity.stop_after_attempt(max(1, tries)),
        wait=tenacity.wait_exponential_jitter(initial=base_s, max=max_wait_s, jitter=base_s),
        retry=tenacity.retry_never,
    )


def poll_until(
    deadline_s: float, every_s: float, retry_if: Callable[[BaseException], bool], reraise: bool = False
) -> tenacity.Retrying:
    """``poll_until(60, 1, is_gone)(fn, *args)``: ``fn(*args)`` again while it raises what ``retry_if`` accepts."""
    return tenacity.Retrying(
        stop=tenacity.stop_after_delay(deadline_s),
        wait=tenacity.wait_fixed(every_s),
        retry=tenacity.retry_if_exception(retry_if),
        reraise=reraise,
    )
