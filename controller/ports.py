"""Port leases: master ports and any further ports an engine needs, per node.

The ledger is derived from the leases held by every reservation, so it is persisted
with them and can never disagree with them.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

import msgspec

from controller.errors import PlacementError

if TYPE_CHECKING:
    from controller.components import ComponentPlacement
    from controller.reservations import ReservationRecord

MAX_PORTS_PER_LEASE = 1024
MASTER = "master"


class PortLease(msgspec.Struct, frozen=True, kw_only=True):
    """Ports leased on one node for one process of a job."""

    node_id: str
    ports: list[int]
    component: str
    rank: int
    purpose: str = MASTER  # "master", or the name a caller gave the lease
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
    if isinstance(count, bool) or not isinstance(count, int):
        raise PlacementError(f"count {count!r}: expected an int")
    if not 1 <= count <= MAX_PORTS_PER_LEASE:
        raise PlacementError(f"count {count}: must be 1-{MAX_PORTS_PER_LEASE}")
    if not isinstance(consecutive, bool):
        raise PlacementError(f"consecutive {consecutive!r}: expected True or False")
    return count


async def lease_ports_for(
    res: ReservationRecord,
    cp: ComponentPlacement,
    held_by_all: Iterable[PortLease],
    component: str,
    rank: int,
    count: int,
    consecutive: bool,
    purpose: str,
) -> PortLease:
    """Find ports on the node of ``component``'s ``rank`` that no lease holds and that
    nothing on the node has bound. The caller serialises calls and records the lease."""
    from controller import raylib
    from controller.reservations import ReservationError

    placements = cp.placements(component)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < len(placements):
        raise PlacementError(
            f"rank {rank!r} of {component!r}: out of range (0-{len(placements) - 1})"
        )
    slot = next(s for s in res.slots if s.node_rank == placements[rank].node_rank)
    held = ledger(held_by_all).get(slot.node_id, set())
    low, high = res.spec.ports.low, res.spec.ports.high
    start = zlib.crc32(f"{res.job}/{component}/{rank}".encode())
    ports = await raylib.free_ports_on(
        slot.node_id, candidates(low, high, held, start), count, consecutive
    )
    if not ports:
        run = " consecutive" if consecutive else ""
        raise ReservationError(
            f"no {count}{run} free port(s) in cluster.ports {low}-{high} on node "
            f"{slot.node_rank} ({slot.node_ip}); placectl leases {len(held)} there"
        )
    return PortLease(
        node_id=slot.node_id,
        node_ip=slot.node_ip,
        ports=ports,
        component=component,
        rank=rank,
        purpose=purpose,
    )
