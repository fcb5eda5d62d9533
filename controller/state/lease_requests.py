"""Requests for leases: ports, and the CPU units of an engine rank (the checks as in
:mod:`controller.state.requests`)."""

from __future__ import annotations

import msgspec

from controller.errors import ReservationError
from controller.state.leases import check_request, check_standby, lease_purpose
from controller.state.requests import ComponentOf, check_flag, check_job, check_token


def check_rank_call(job: str, component: str, rank: object, token: str, force: bool) -> None:
    """The fields every lease for one rank carries: its job and component, the rank (an
    int), and who asks."""
    ComponentOf(job, component)
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise ReservationError(f"rank {rank!r}: expected an int")
    check_token(token)
    check_flag(force, "force")


class LeasePorts(msgspec.Struct):
    """``lease_ports``: ``count`` ports (``consecutive`` or not) on the node of
    ``component``'s ``rank`` (or for its ``standby`` in a held spare's bundle: placement
    group id, bundle index), found again by ``name`` or ``request_id``."""

    job: str
    component: str
    rank: int = 0
    count: int = 1
    consecutive: bool = True
    name: str | None = None
    request_id: str | None = None
    token: str = ""
    force: bool = False
    standby: tuple[str, int] | None = None

    def __post_init__(self) -> None:
        check_rank_call(self.job, self.component, self.rank, self.token, self.force)
        check_request(self.count, self.consecutive)
        lease_purpose(self.name, self.request_id)
        self.standby = check_standby(self.standby)


class ReleasePorts(msgspec.Struct):
    """``release_ports``: end the leases of ``job`` holding any of ``ports``."""

    job: str
    ports: list[int]
    token: str = ""
    force: bool = False

    def __post_init__(self) -> None:
        check_job(self.job)
        if not isinstance(self.ports, (list, tuple)) or not all(
            isinstance(p, int) and not isinstance(p, bool) for p in self.ports
        ):
            raise ReservationError(f"ports {self.ports!r}: expected a list of port numbers")
        self.ports = list(self.ports)
        check_token(self.token)
        check_flag(self.force, "force")


class LeaseCores(msgspec.Struct):
    """``lease_cores``: CPU units of its node for ``component``'s ``rank`` (or its
    ``standby``, as for ports), as many as its bundles hold; found again by ``name``."""

    job: str
    component: str
    rank: int
    name: str
    token: str = ""
    force: bool = False
    standby: tuple[str, int] | None = None

    def __post_init__(self) -> None:
        check_rank_call(self.job, self.component, self.rank, self.token, self.force)
        lease_purpose(self.name, None)
        self.standby = check_standby(self.standby)
