"""Core leases: which of a node's CPUs each engine process binds, disjoint on the node.

Ray reserves CPU *amounts* in a placement group's bundles, never particular cores, and
vLLM's CPU build binds each engine worker to a list of cores. Two engines on one node,
of two components or two reservations, that each split the node's cores alone bind the
same ones. So a rank leases, on its node, a run of the node's CPU units as many as its
bundles hold (Ray's ``CPU`` of those bundles); the controller keeps the runs of every
reservation on a node disjoint, and the rank maps its units to the cores its process may
run on (:func:`cores_of`).

Like port leases, core leases live in the records (the ledger is derived from them) and
end with the reservation; those on a node the reservation leaves (a repair, an apply) go
with the slot.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from controller.errors import PlacementError


class CoreLease(msgspec.Struct, frozen=True, kw_only=True):
    """CPU units ``first`` .. ``first + count - 1`` of a node, leased to one process.

    Attributes:
        node_id: the node.
        first, count: the run of the node's CPU units (0 .. ``node_cpus`` - 1).
        node_cpus: the node's CPU units in total (Ray's ``CPU``) when it was leased.
        component, rank: the process.
        purpose: ``"name:<name>"``: a lease is found again by it (idempotent).
    """

    node_id: str
    first: int
    count: int
    node_cpus: int
    component: str
    rank: int
    purpose: str

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
