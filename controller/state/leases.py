"""Leases, and the ledgers derived from them: ports, and the CPU units engine ranks bind.

A ledger is never stored on its own: it is computed from the leases every reservation
holds, so it is persisted with them and can never disagree with them.

Ports: a lease is a set of ports on one node, checked free there. CPU units: Ray
reserves CPU *amounts* in a placement group's bundles, never particular cores, and vLLM's
CPU build binds each engine worker to a list of cores. Two engines on one node, of two
components or two reservations, that each split the node's cores alone bind the same
ones. So a rank leases, on its node, a run of the node's CPU units as many as its
bundles hold (Ray's ``CPU`` of those bundles); the controller keeps the runs of every
reservation on a node disjoint, and the rank maps its units to the cores its process may
run on (:func:`cores_of`). Leases end with the reservation; those on a node the
reservation leaves (a repair, an apply) go with the slot.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

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
        standby: ``(placement group id, bundle index)`` of a held spare's bundle when
            leased for the standby process there (``rank`` is then -1); a repair that
            makes the spare a slot hands the lease to the rank now in that bundle
            (:func:`controller.state.standbys.settle_standby_leases`).
    """

    node_id: str
    ports: list[int]
    component: str
    rank: int
    purpose: str = MASTER
    node_ip: str = ""
    standby: tuple[str, int] | None = None


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


def check_standby(standby: object) -> tuple[str, int] | None:
    """``standby`` as a lease keeps it: None, or (placement group id, bundle index)."""
    if standby is None:
        return None
    ok = isinstance(standby, (list, tuple)) and len(standby) == 2
    if ok and isinstance(standby[0], str) and standby[0]:
        index = standby[1]
        if isinstance(index, int) and not isinstance(index, bool) and index >= 0:
            return (standby[0], index)
    raise PlacementError(
        f"standby {standby!r}: expected (placement group id, bundle index) of a held spare"
    )


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


class CoreLease(msgspec.Struct, frozen=True, kw_only=True):
    """CPU units ``first`` .. ``first + count - 1`` of a node, leased to one process.

    Attributes:
        node_id: the node.
        first, count: the run of the node's CPU units (0 .. ``node_cpus`` - 1).
        node_cpus: the node's CPU units in total (Ray's ``CPU``) when it was leased.
        component, rank: the process.
        purpose: ``"name:<name>"``: a lease is found again by it (idempotent).
        standby: a held spare's bundle, as for :class:`PortLease`.
    """

    node_id: str
    first: int
    count: int
    node_cpus: int
    component: str
    rank: int
    purpose: str
    standby: tuple[str, int] | None = None

    def units(self) -> range:
        return range(self.first, self.first + self.count)


def core_ledger(leases: Iterable[CoreLease]) -> dict[str, set[int]]:
    """The CPU units held on each node id."""
    held: dict[str, set[int]] = {}
    for lease in leases:
        held.setdefault(lease.node_id, set()).update(lease.units())
    return held


def pick_units(held: set[int], total: int, count: int) -> int | None:
    """The first unit of the lowest unbroken run of ``count`` units of ``0 .. total - 1``
    that ``held`` leaves free; None when there is none."""
    run = 0
    for unit in range(total):
        run = 0 if unit in held else run + 1
        if run == count:
            return unit - count + 1
    return None


def cores_of(first: int, count: int, node_cpus: int, cores: Sequence[int]) -> list[int]:
    """The cores a lease of units ``first`` .. ``first + count - 1`` of ``node_cpus`` binds,
    of ``cores`` (the cores the process may run on, sorted). With as many cores as units
    (a real node, where Ray's ``CPU`` is the core count) unit ``u`` is core ``u``: two
    leases never share a core. With fewer (a node that declares more CPUs than it has)
    units are spread evenly over the cores, and leases may share some.

    Raises:
        PlacementError: a run outside ``0 .. node_cpus - 1``, or no cores.
    """
    if node_cpus < 1 or count < 1 or first < 0 or first + count > node_cpus:
        raise PlacementError(
            f"CPU units {first}-{first + count - 1} of a node of {node_cpus}: out of range"
        )
    ordered = sorted(set(cores))
    if not ordered:
        raise PlacementError("this process may run on no core (its CPU affinity is empty)")
    if len(ordered) >= node_cpus:
        return ordered[first : first + count]
    picked = {ordered[u * len(ordered) // node_cpus] for u in range(first, first + count)}
    return sorted(picked)
