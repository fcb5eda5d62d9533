"""Waiting out the GCS's absence while the head restarts.

With Ray's GCS fault tolerance, the GCS may be gone for seconds (its process restarting,
or the whole head node): running actors and tasks go on, but every call to the GCS
(the table in its key-value store, node liveness) fails once its own timeout passes with
``ray.exceptions.RpcError("Timed out while waiting for GCS to become available")``.
Reads and writes of the table are idempotent, so the controller and the drivers retry
them in short attempts until a bound, saying why they wait, and raise
:class:`~controller.errors.ClusterUnavailable` after it. The bound defaults to Ray's own:
a process that cannot reach the GCS for ``RAY_gcs_rpc_server_reconnect_timeout_s``
(60 s by default) is ended by Ray anyway.

Which errors mean "the GCS is away" is the caller's to say (Ray's edge:
``ray_io.gcs_unavailable``), so this module imports no Ray and is unit-tested with
stand-ins.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from controller.errors import ClusterUnavailable

T = TypeVar("T")

ATTEMPT_S = 5.0  # one call's own timeout: also how often a waiter says it still waits


def bound_s() -> float:
    """Seconds to wait for the GCS: ``PLACECTL_GCS_WAIT_S``, else Ray's reconnect bound."""
    for name in ("PLACECTL_GCS_WAIT_S", "RAY_gcs_rpc_server_reconnect_timeout_s"):
        value = os.environ.get(name)
        if value:
            try:
                return max(float(value), ATTEMPT_S)
            except ValueError:
                pass
    return 60.0


def _waiting(what: str, waited: float, bound: float) -> str:
    return (
        f"the GCS does not answer ({what}): the head node is restarting or lost; "
        f"waiting up to {bound:.0f}s ({waited:.0f}s so far)"
    )


def _gave_up(what: str, bound: float, e: BaseException) -> ClusterUnavailable:
    return ClusterUnavailable(
        f"the GCS did not answer {what} for {bound:.0f}s ({e}); a head node restarting "
        "with GCS fault tolerance is back within that; without it (no RAY_REDIS_ADDRESS) "
        "a lost head loses every reservation"
    )


class _Waiter:
    """The bookkeeping of one wait: when it started, when it last spoke."""

    def __init__(self, what, say, bound, unavailable, clock) -> None:
        self.what, self.say, self.unavailable, self.clock = what, say, unavailable, clock
        self.bound = bound_s() if bound is None else bound
        self.started = clock()
        self._next_say = self.started

    def attempt_timeout(self) -> float:
        return max(min(ATTEMPT_S, self.bound - (self.clock() - self.started)), 0.1)

    def failed(self, e: Exception) -> None:
        """Raise ``e`` unless it means the GCS is away; give up after the bound; say
        that it waits at most once per attempt period."""
        if not self.unavailable(e):
            raise e
        now = self.clock()
        waited = now - self.started
        if waited >= self.bound:
            raise _gave_up(self.what, self.bound, e) from e
        if now >= self._next_say:
            self.say(_waiting(self.what, waited, self.bound))
            self._next_say = now + ATTEMPT_S


def retry(
    call: Callable[[float], T],
    what: str,
    say: Callable[[str], None],
    unavailable: Callable[[BaseException], bool],
    bound: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    pause: float = 0.2,
) -> T:
    """``call(attempt_timeout)`` until it answers, while the GCS does not.

    Args:
        call: one attempt, given its timeout in seconds.
        what: what is being asked, for the messages.
        say: where to say that it waits and why (every ``ATTEMPT_S`` at most).
        unavailable: which errors mean "the GCS is not there"; others pass through.
        bound: seconds to keep trying (default :func:`bound_s`).
        pause: the least time between attempts (a refused connection fails at once).

    Raises:
        ClusterUnavailable: the GCS did not answer within ``bound``.
    """
    waiter = _Waiter(what, say, bound, unavailable, clock)
    while True:
        tried = clock()
        try:
            return call(waiter.attempt_timeout())
        except Exception as e:
            waiter.failed(e)
        if clock() - tried < pause:
            time.sleep(pause)


async def aretry(
    call: Callable[[float], Awaitable[T]],
    what: str,
    say: Callable[[str], None],
    unavailable: Callable[[BaseException], bool],
    bound: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    pause: float = 0.2,
) -> T:
    """:func:`retry` for the controller's event loop."""
    waiter = _Waiter(what, say, bound, unavailable, clock)
    while True:
        tried = clock()
        try:
            return await call(waiter.attempt_timeout())
        except Exception as e:
            waiter.failed(e)
        if clock() - tried < pause:
            await asyncio.sleep(pause)
