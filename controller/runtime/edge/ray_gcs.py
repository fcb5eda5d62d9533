"""Ray's GCS, where placectl reaches it below Ray's Python API: telling it a node is
dead (a fence), where it keeps its tables, and what its unavailability looks like. Part
of the Ray edge, with :mod:`controller.runtime.edge.ray_io`.

**Waiting out the GCS's absence** while the head restarts.

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

import ray

from controller.errors import ClusterUnavailable
from controller.ray_versions import ROCKSDB_STORE, has


def gcs_store(env, release: str = "") -> str:
    """Where the GCS keeps its tables, from the environment of a process the head
    started (the controller runs on the head): Ray's GCS reads the same variables.
    ``RAY_REDIS_ADDRESS`` (``ray start --head``, KubeRay's GCS fault tolerance) means
    Redis; ``RAY_gcs_storage=rocksdb`` the embedded store (alpha in Ray 2.60), which a
    Ray ``release`` before 2.57 does not have: its GCS keeps the tables in memory."""
    if env.get("RAY_REDIS_ADDRESS") or env.get("RAY_gcs_storage", "").lower() == "redis":
        return "redis"
    if env.get("RAY_gcs_storage", "").lower() == "rocksdb" and has(ROCKSDB_STORE, release):
        return "rocksdb"
    return "memory"


def gcs_unavailable(e: BaseException) -> bool:
    """Whether ``e`` is Ray saying that the GCS does not answer (not that it refused):
    ``RpcError("Timed out while waiting for GCS to become available")`` on Ray 2.60."""
    return isinstance(e, ray.exceptions.RpcError)


def draining_nodes(timeout: float) -> dict[str, int]:
    """The nodes Ray is draining (hex id -> deadline in ms since the epoch, 0 for none),
    a blocking read. Ray 2.60 asks the GCS with a timeout; before it, the only reader is
    the driver's global state accessor (the same dict, and no timeout of its own)."""
    gcs = ray._private.worker.global_worker.gcs_client  # as `ray drain-node` does
    if hasattr(gcs, "get_draining_nodes") or not hasattr(ray._private.state, "state"):
        return dict(gcs.get_draining_nodes(timeout=timeout))
    return dict(ray._private.state.state.get_draining_nodes())


def alive_by_table(node_ids: list[str]) -> list[bool]:
    """Whether each of ``node_ids`` is alive in Ray's node table (a blocking read of the
    whole table). For Ray releases whose GCS ``check_alive`` takes raylet addresses
    instead of node ids (2.48 does; it raises TypeError given ids)."""
    alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    return [n in alive for n in node_ids]


# The GCS's own reason for a node lost without notice (ray.rpc.NodeDeathInfo.Reason).
_UNEXPECTED_TERMINATION = 2


def fence_node(gcs_address: str, node_id: str, why: str, timeout: float = 10.0) -> None:
    """Tell the GCS that ``node_id`` is dead now, as its raylet would on leaving.

    Ray then does what it does after its own health checks give up: the node's actors
    are dead, its placement-group bundles are rescheduled, and every subscriber hears
    the node died. A raylet of a fenced node that comes back (``SIGCONT``, a healed
    partition) is told it is dead and exits, and its workers exit with it; it never
    gets its node id back. Idempotent: a node already dead is left as it is.

    The call is secured as Ray secures its own (:mod:`controller.runtime.edge.answers`).

    Raises:
        CallDenied: the GCS refused placectl (token, TLS): nothing was fenced.
        grpc.RpcError: the call failed otherwise (the GCS away, the deadline passed).
    """
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    from controller.runtime.edge.answers import CallDenied, denied, open_channel

    request = gcs_service_pb2.UnregisterNodeRequest(node_id=bytes.fromhex(node_id))
    request.node_death_info.reason = _UNEXPECTED_TERMINATION
    request.node_death_info.reason_message = why
    with open_channel(gcs_address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.UnregisterNode(request, timeout=timeout)
        except grpc.RpcError as e:
            refusal = denied(e)
            if refusal is not None:
                raise CallDenied(refusal) from None
            raise


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
