"""A driver's view of one reservation: its state, assignments, ports and readiness."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from controller import PlacementError
from controller.errors import (
    ReservationDegraded,
    ReservationError,
    ReservationTimeout,
    StaleReservation,
)
from controller.state.assignments import Assignment
from controller.state.lease_requests import LeaseCores, LeasePorts, ReleasePorts
from controller.state.published import ComponentBlock, ReservationInfo, summarize
from controller.state.records import DEGRADED, READY, ReservationRecord, with_dead_nodes
from controller.state.requests import ComponentOf

if TYPE_CHECKING:
    from clients.session import Controller
    from controller.planning.spec import ClusterSpec

_BLOCK = msgspec.msgpack.Decoder(ComponentBlock)
PROGRESS_PERIOD_S = 5.0


class Reservation:
    """A driver's view of one reservation.

    Assignments come from the table in the GCS, published by the controller for each
    epoch: looking them up never queues behind other drivers and never re-plans. The
    view follows the reservation: when its uid (a new reservation of the same name) or
    epoch (a replaced slot) changes, the next lookup serves the new assignments.

    Readiness is checked against Ray, not only against the table: every read of a
    ``ready`` record also asks Ray's node table about the nodes it holds (one round
    trip, these nodes only), and one Ray reports dead makes the reservation
    ``degraded`` here at once, before the controller has written it so.
    """

    def __init__(self, controller: Controller, source: ReservationRecord | ReservationInfo):
        self.controller = controller
        self._record: ReservationRecord | None = None
        self._info: ReservationInfo | None = None
        self._blocks: dict[str, list[Assignment]] = {}
        self._of: tuple[str, int] = ("", 0)  # the uid and epoch of the cached blocks
        if isinstance(source, ReservationRecord):
            self._adopt(source)
        else:
            self._info = source

    def _adopt(self, record: ReservationRecord) -> None:
        if self._of != (record.uid, record.epoch):
            self._blocks = {}
            self._of = (record.uid, record.epoch)
        self._record = record
        self._info = None  # summarised when asked for

    @property
    def info(self) -> ReservationInfo:
        """The reservation as ``status`` shows it, as of the last read."""
        if self._info is None:
            self._info = summarize(self._record)
        return self._info

    @property
    def job(self) -> str:
        return self._record.job if self._record is not None else self.info.job

    @property
    def epoch(self) -> int:
        return self._record.epoch if self._record is not None else self.info.epoch

    @property
    def uid(self) -> str:
        return self._record.uid if self._record is not None else self.info.uid

    @property
    def state(self) -> str:
        return self._record.state if self._record is not None else self.info.state

    @property
    def spec(self) -> ClusterSpec:
        """The configuration the reservation holds (read once if only summarised)."""
        if self._record is None:
            self._refresh_record()
        return self._record.spec

    @property
    def components(self) -> list[str]:
        if self._record is not None:
            return list(self._record.world_sizes)
        return list(self.info.components)

    def refresh(self) -> ReservationInfo:
        """Re-read the stored record (state, epoch, identity, slots), checked against
        Ray's node table: never ``ready`` while Ray reports one of its nodes dead."""
        self._refresh_record()
        return self.info

    def _refresh_record(self) -> None:
        record = self.controller.record(self.job)
        if record.state == READY:
            record = with_dead_nodes(record, self.controller.dead_nodes(record.node_ids()))
        self._adopt(record)

    def _load(self, component: str) -> list[Assignment]:
        record = self._record
        for _ in range(5):
            block = self.controller.component(self.job, component)
            if block is not None and (block.uid, block.epoch) == (record.uid, record.epoch):
                return self._stamped(block)
            time.sleep(0.05)  # the controller writes assignments just before the record
            self._refresh_record()
            record = self._record
        # Still apart (a write that failed half way): the controller's memory is consistent.
        call = ComponentOf(job=self.job, component=component)
        block = _BLOCK.decode(self.controller.call("component", call))
        if (block.uid, block.epoch) != (record.uid, record.epoch):
            raise StaleReservation(f"reservation {self.job!r} changed while being read; retry")
        return self._stamped(block)

    def _stamped(self, block: ComponentBlock) -> list[Assignment]:
        """The block's assignments, each one's environment naming the controller whose
        table it came from: a process started from its assignment alone
        (``Actor.options(**a.actor_options())``) reads itself back from that controller,
        as one a worker group starts does."""
        mine = {"PLACECTL_CONTROLLER": self.controller.name}
        return [msgspec.structs.replace(a, env={**a.env, **mine}) for a in block.assignments()]

    def assignments(self, component: str, allow_degraded: bool = False) -> list[Assignment]:
        """Each rank's :class:`Assignment` for ``component``, in rank order, as of the
        reservation's current uid and epoch: one read of the record (and one question
        to Ray about its nodes), and of the component's assignments only when they
        changed.

        Args:
            allow_degraded: also answer while the reservation is degraded (a node lost,
                its slot not yet replaced): the surviving ranks' assignments stay
                valid, the lost ones name bundles that cannot run anything. A worker
                reading its own (``clients.current()``) does this.

        Raises:
            ReservationDegraded: it is degraded and ``allow_degraded`` is false; wait
                with :meth:`wait_ready`.
            ReservationError: it is not settled (pending, releasing).
        """
        self._refresh_record()
        if self.state == DEGRADED and not allow_degraded:
            raise ReservationDegraded(
                f"reservation {self.job!r} is degraded ({self._record.reason}); "
                "wait_ready() waits for its repair"
            )
        if self.state not in (READY, DEGRADED):
            raise ReservationError(
                f"reservation {self.job!r} is {self.state}; assignments need ready"
            )
        if component not in self._record.world_sizes:
            raise PlacementError(
                f"unknown component {component!r} in {self.job!r}; it has "
                f"{', '.join(self._record.world_sizes)}"
            )
        if component not in self._blocks:
            self._blocks[component] = self._load(component)
        return self._blocks[component]

    def standbys(self, component: str) -> list[Assignment]:
        """What the standby processes of ``component`` start with on the held spares,
        one per bundle the copied node gives the component (:mod:`clients.standby`);
        empty when the reservation holds no spare."""
        call = ComponentOf(job=self.job, component=component)
        items = msgspec.msgpack.decode(
            self.controller.call("standbys", call), type=list[Assignment]
        )
        mine = {"PLACECTL_CONTROLLER": self.controller.name}
        return [msgspec.structs.replace(a, env={**a.env, **mine}) for a in items]

    def release(self, force: bool = False) -> bool:
        return self.controller.release(self.job, force=force)

    def repair(self, force: bool = False) -> ReservationInfo:
        """Replace lost slots now (the ``manual`` repair policy waits for this)."""
        self.controller.repair(self.job, force=force)
        return self.refresh()

    def lease_ports(
        self,
        component: str,
        rank: int = 0,
        count: int = 1,
        consecutive: bool = True,
        name: str | None = None,
        standby: tuple[str, int] | None = None,
    ) -> list[int]:
        """Lease ``count`` ports on the node of ``component``'s ``rank``, or with
        ``standby`` (a standby's placement group id and bundle index,
        :meth:`standbys`) on its held spare: when a repair makes the standby that
        bundle's rank, the lease is the rank's, found again by the same ``name``.

        Each call returns ports not returned before while they are leased (concurrent
        callers included), checked free on that node and outside its ephemeral port
        range; ``consecutive`` asks for an unbroken run. With ``name`` the call is
        idempotent; without, a retry of this very call (by Ray, after a controller
        crash) still finds its lease. Leases end with the reservation or
        :meth:`release_ports`.
        """
        call = LeasePorts(
            job=self.job,
            component=component,
            rank=rank,
            count=count,
            consecutive=consecutive,
            name=name,
            request_id=None if name is not None else uuid.uuid4().hex,
            token=self.controller.token,
            standby=standby,
        )
        return self.controller.call("lease_ports", call)

    def lease_cores(
        self, component: str, rank: int, name: str, standby: tuple[str, int] | None = None
    ) -> dict[str, int | str]:
        """Lease, on the node of ``component``'s ``rank``, a run of the node's CPU units as
        many as the rank's bundles hold, leased to no other rank on that node (of any
        reservation); idempotent by ``name``. Returns ``first``, ``count``, ``node_cpus``
        and ``node_id``; :func:`controller.state.leases.cores_of` maps them to cores. Leases
        end with the reservation, or with the slot when the reservation leaves the node.
        ``standby`` as for :meth:`lease_ports`.
        """
        call = LeaseCores(
            job=self.job,
            component=component,
            rank=rank,
            name=name,
            token=self.controller.token,
            standby=standby,
        )
        return self.controller.call("lease_cores", call)

    def release_ports(self, ports: list[int]) -> int:
        """End the leases holding any of ``ports``; master ports stay."""
        call = ReleasePorts(job=self.job, ports=list(ports), token=self.controller.token)
        return self.controller.call("release_ports", call)

    def wait_ready(
        self,
        timeout: float = 60.0,
        poll_s: float = 0.25,
        newer_than: int | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> ReservationInfo:
        """Block until the reservation is ready, reading only the table and asking Ray
        about its nodes: a record that names a node Ray reports dead is not ready, even
        if it says so. Polls fast at first (a repair takes about a second), then every
        ``poll_s``.

        A node that died without a word is dead to Ray once the controller fences it
        (about 1.5 s after the fault; 5 s of silence for a hung one): called in between,
        this returns ``ready`` on the old slot. ``WorkerGroup.repair()`` waits for that
        verdict itself; ``newer_than`` waits for the repaired epoch.

        Args:
            newer_than: also wait until the epoch is greater than this one (the epoch at
                which the caller saw something fail).
            progress: where to say what it waits for, every few seconds (default
                stderr).

        Raises:
            ReservationTimeout: not ready within ``timeout``; says why.
            UnknownReservation: it was released meanwhile.
        """
        say = progress or (lambda m: print(f"placectl: {m}", file=sys.stderr, flush=True))
        started = time.monotonic()
        deadline = started + timeout
        next_say = started + PROGRESS_PERIOD_S
        delay = 0.01
        while True:
            info = self.refresh()
            fresh = newer_than is None or info.epoch > newer_than
            if info.state == READY and fresh:
                return info
            why = info.reason or info.state
            if info.state == READY:
                why = f"epoch {info.epoch}, waiting for one after {newer_than}"
            now = time.monotonic()
            if now >= deadline:
                raise ReservationTimeout(
                    f"reservation {self.job!r} is not ready after {timeout:g}s: it is "
                    f"{info.state} ({why})"
                )
            if now >= next_say:
                say(f"{self.job}: waiting {now - started:.0f}s for it to be ready: {why}")
                next_say = now + PROGRESS_PERIOD_S
            time.sleep(min(delay, max(deadline - now, 0.0)))
            delay = min(delay * 2, poll_s)


__all__ = ["Reservation"]
