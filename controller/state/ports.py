"""Port leases and the ledger derived from them.

The ledger is never stored on its own: it is computed from the leases every reservation
holds, so it is persisted with them and can never disagree with them.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from controller.errors import PlacementError

MAX_PORTS_PER_LEASE = 1024
MASTER = "master"
NAMED = "name:"  # + the caller's name: idempotent by name
REQUEST = "req:"  # + a request id the client made up: idempotent under Ray's retries


class PortLease(msgspec.Struct, frozen=True, kw_only=True):
    """Ports leased on one node for one process of a job.

    Attributes:
        node_id, node_ip: where the ports were checked free.
        ports: the leased ports, ascending.
        component, rank: the process they were leased for.
        purpose: ``"master"``, ``"name:<name>"`` or ``"req:<id>"``; a lease is found again
            by it, which makes every lease call idempotent.
    """

    node_id: str
    ports: list[int]
    component: str
    rank: int
    purpose: str = MASTER
    node_ip: str = ""


def ledger(leases: Iterable[PortLease]) -> dict[str, set[int]]:
    """Ports held on each node id."""
    held: dict[str, set[int]] = {}
    for lease in leases:
        held.setdefault(lease.node_id, set()).update(lease.ports)
    return held


def candidates(low: int, high: int, held: set[int], start: int = 0) -> list[int]:
    """Ports of ``[low, high]`` not in ``held``, ascending from an offset ``start`` and
    wrapping around, so that jobs do not all begin their search at ``low``."""
    span = high - low + 1
    first = low + start % span
    ordered = list(range(first, high + 1)) + list(range(low, first))
    return [p for p in ordered if p not in held]


def check_request(count: object, consecutive: object) -> int:
    """``count`` checked to be an int in 1..MAX_PORTS_PER_LEASE; ``consecutive`` a bool."""
    if isinstance(count, bool) or not isinstance(count, int):
        raise PlacementError(f"count {count!r}: expected an int")
    if not 1 <= count <= MAX_PORTS_PER_LEASE:
        raise PlacementError(f"count {count}: must be 1-{MAX_PORTS_PER_LEASE}")
    if not isinstance(consecutive, bool):
        raise PlacementError(f"consecutive {consecutive!r}: expected True or False")
    return count


def lease_purpose(name: object, request_id: object) -> str:
    """The purpose a lease is recorded under: the caller's name, else its request id.

    Raises:
        PlacementError: a name or request id that is not a non-empty string of at most
            128 characters.
    """
    for what, value, prefix in (("name", name, NAMED), ("request_id", request_id, REQUEST)):
        if value is None:
            continue
        if not isinstance(value, str) or not 0 < len(value) <= 128:
            raise PlacementError(f"{what} {value!r}: expected a non-empty string of <= 128 chars")
        return prefix + value
    raise PlacementError("a port lease needs a name or a request_id (clients make one up)")


def pick_run(free: list[int], count: int, consecutive: bool) -> list[int]:
    """The first ``count`` ports of ``free`` (in order), or the first unbroken run of
    ``count`` when ``consecutive``; empty when there is none."""
    if not consecutive:
        return free[:count] if len(free) >= count else []
    run: list[int] = []
    for port in free:
        run = [*run, port] if run and port == run[-1] + 1 else [port]
        if len(run) == count:
            return run
    return []
