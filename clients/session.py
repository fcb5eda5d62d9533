"""Attaching to the controller and using reservations from a driver."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from typing import Any

import msgspec
import ray

from clients.changes import ChangeClient
from clients.driver_table import RayTable
from clients.nodes import NodeClient
from clients.queue import QueueClient
from clients.reservation import Reservation
from clients.transport import DEFAULT_NAME, DEFAULT_NAMESPACE
from clients.versions import check_ray_features, check_ray_version
from controller import ClusterSpec, load_spec
from controller.errors import (
    ControllerNotFound,
    ReservationCancelled,
    TableUnreadable,
    UnknownReservation,
)
from controller.state.published import ComponentBlock, ReservationInfo
from controller.state.records import AUTO, ReservationRecord
from controller.state.requests import Everyone, JobOf, NodesOf, Owned, Reserve, check_job
from controller.state.table import (
    LEGACY_KEY,
    META,
    RECORD,
    check_meta,
    component_key,
    decode,
    key,
)
from controller.surface import HEAD_RESOURCE

_INFO = msgspec.msgpack.Decoder(ReservationInfo)
_INFOS = msgspec.msgpack.Decoder(list[ReservationInfo])


def connect(
    address: str | None = None,
    start: bool = True,
    name: str = DEFAULT_NAME,
    namespace: str = DEFAULT_NAMESPACE,
    token: str | None = None,
    settings: dict[str, str] | None = None,
) -> Controller:
    """Attach to the cluster's controller, starting it if needed.

    Args:
        address: Ray address (``"auto"`` for a running cluster). With ``None`` and no
            cluster running, Ray starts a local instance. If Ray is initialised already,
            nothing about it changes: not its namespace, not where worker logs go.
        start: create the controller if it does not exist. Two drivers starting it at
            once get the same one. It is pinned to the head node with a sliver of the
            head's own resource, so a restart brings it back there.
        name: the controller actor's name.
        namespace: the controller actor's namespace.
        token: the owner token of the reservations this client creates and changes
            (default: ``PLACECTL_TOKEN``, else the user's token file; see
            :mod:`clients.owner_token`).
        settings: the controller's settings by name (``{"suspect_after": "3"}``), for a
            controller this call starts; a running one keeps its own (said on stderr).
            Checked before anything starts.

    Returns:
        A handle; it works from any Ray namespace.

    Raises:
        ControllerNotFound: no controller exists and ``start`` is False.
        SettingsError: ``settings`` names an unknown setting or a value it does not take.
    """
    check_ray_version(ray.__version__)
    check_ray_features(os.environ, ray.__version__)
    from controller.surface import settings_by_name as by_name

    carried = by_name(settings or {})
    if not ray.is_initialized():
        ray.init(address=address)
    try:
        handle = ray.get_actor(name, namespace=namespace)
        created = False
        if carried:
            print(
                f"placectl: controller {name!r} runs already; its settings were fixed when it "
                "started (placectl stop, then start with --set, to change them)",
                file=sys.stderr,
            )
    except ValueError:
        if not start:
            raise ControllerNotFound(
                f"no placectl controller named {name!r} in namespace {namespace!r}; start one "
                "with `placectl start` or connect(start=True)"
            ) from None
        from controller.surface import PlacementController

        handle = (
            ray.remote(PlacementController)
            .options(
                name=name,
                namespace=namespace,
                lifetime="detached",
                get_if_exists=True,
                max_restarts=-1,
                max_task_retries=-1,
                num_cpus=0,
                resources={HEAD_RESOURCE: 0.001},
                max_concurrency=1000,
                runtime_env={"env_vars": carried} if carried else None,
            )
            .remote(name)
        )
        created = True
    ctl = Controller(handle, name, namespace, token=token)
    if created:
        ctl.check_alive()  # surface a controller that cannot start, here and now
    return ctl


class Controller(ChangeClient, QueueClient, NodeClient):
    """A driver's handle to the controller. Mutations are calls to the actor; reads of a
    reservation go straight to the table in the GCS."""

    def __init__(
        self,
        handle: Any = None,
        name: str = DEFAULT_NAME,
        namespace: str = DEFAULT_NAMESPACE,
        table: Any = None,
        token: str | None = None,
    ):
        super().__init__(handle, name, namespace, token)
        self._table = table if table is not None else RayTable(name)

    def reserve(
        self,
        job: str,
        spec: Any,
        timeout_s: float = 300.0,
        replace: bool = False,
        progress: Callable[[str], None] | None = None,
        repair: str = AUTO,
        queue: str = "",
        priority: int = 0,
        force: bool = False,
        preemptible: bool = False,
        preempt_grace_s: float = 0.0,
    ) -> Reservation:
        """Reserve ``spec`` (a path, YAML, dict or ClusterSpec) for ``job``.

        Idempotent: the same job and spec returns the existing reservation. While the
        controller waits for resources, what it is waiting for is passed to ``progress``
        (default: printed to stderr) every time it changes. Ctrl-C cancels the pending
        reservation, and nothing is left behind.

        Args:
            repair: ``auto`` replaces a lost node's slot at once; ``manual`` leaves the
                reservation degraded until :meth:`Reservation.repair`.
            queue: wait in this queue when it does not fit now: nothing is placed
                until all of it fits; progress says its position and what it waits for;
                Ctrl-C or the timeout leave the queue.
            priority: its place in the queue, higher first.
            force: replace (``replace=True``) a reservation another client owns.
            preemptible: a queued reservation of higher priority may take it back: its
                ``info.preempt_at`` (and ``clients.preempt_deadline()`` in its workers)
                then says when it is released: ``preempt_grace_s`` after it was chosen
                (default: the controller's, 60 s), time to checkpoint.

        Raises:
            PlacementError: the configuration does not fit the cluster.
            ReservationTimeout: not satisfied within ``timeout_s``; nothing is left behind.
            ReservationConflict: ``job`` is reserved with another spec and not ``replace``.
            ReservationCancelled: a ``release`` of the job (or Ctrl-C) cancelled it.
        """
        spec = spec if isinstance(spec, ClusterSpec) else load_spec(spec)
        call = Reserve(
            job=job,
            spec=spec,
            timeout_s=timeout_s,
            replace=replace,
            repair=repair,
            queue=queue,
            priority=priority,
            token=self.token,
            force=force,
            preemptible=preemptible,
            preempt_grace_s=preempt_grace_s,
        )
        try:
            info = _INFO.decode(self.follow("reserve", call, job, progress))
        except KeyboardInterrupt:
            ray.get(self.handle.cancel.remote(job), timeout=60)
            raise
        return Reservation(self, info)

    def reservation(self, job: str) -> Reservation:
        """Attach to an existing reservation.

        Reads the table straight from the GCS key-value store (the job's record and its
        published assignments): no call to the controller, so it works while the
        controller restarts.
        """
        return Reservation(self, self.record(job))

    def _check_table(self) -> None:
        meta = self._table.get(META)
        check_meta(meta)
        if meta is None and self._table.get(LEGACY_KEY) is not None:
            raise TableUnreadable(
                "the table is still in format 1 (placectl 0.1); start the controller "
                "(`placectl start`), which migrates it"
            )

    def dead_nodes(self, node_ids) -> set[str]:
        """Those of ``node_ids`` Ray reports dead right now (one GCS round trip)."""
        return self._table.dead_nodes(sorted(set(node_ids)))

    def record(self, job: str) -> ReservationRecord:
        """The stored record of ``job``, as written (see :meth:`Reservation.refresh`
        for the record checked against Ray's node table)."""
        check_job(job)
        data = self._table.get(key(RECORD, job))
        if data is None:
            self._check_table()
            known = ", ".join(sorted(self.table())) or "none"
            raise UnknownReservation(f"no reservation named {job!r} (reserved: {known})")
        return decode(data, ReservationRecord, f"record {job!r}")

    def component(self, job: str, component: str) -> ComponentBlock | None:
        """The stored assignments of one component of ``job`` (None before it is ready)."""
        data = self._table.get(component_key(job, component))
        what = f"assignments of {job}/{component}"
        return None if data is None else decode(data, ComponentBlock, what)

    def table(self) -> dict[str, ReservationRecord]:
        """Every stored record, by job name, read from the GCS (not from the controller)."""
        self._check_table()
        out = {}
        for k in self._table.keys(RECORD):
            data = self._table.get(k)
            if data is not None:
                record = decode(data, ReservationRecord, f"record {k.decode()!r}")
                out[record.job] = record
        return dict(sorted(out.items()))

    def status(self, job: str) -> ReservationInfo:
        """``job``'s reservation as the controller sees it now: never ``ready`` while Ray
        reports one of its nodes dead or one of its raylets refuses connections.

        Raises:
            UnknownReservation: no reservation named ``job``.
        """
        return _INFO.decode(self.call("status", JobOf(job)))

    def list(self) -> list[ReservationInfo]:
        """Every reservation, by job name, checked against Ray's node table."""
        return _INFOS.decode(self.call("list"))

    def suspects(self, job: str) -> list[str]:
        """The nodes of ``job`` whose raylets do not answer and that the controller has
        not fenced yet; asking fences a node whose raylet refuses connections."""
        return self.call("suspects", JobOf(job))

    def verdicts(
        self,
        job: str,
        nodes: list[str] | None = None,
        unless: dict[str, str] | None = None,
        wait_s: float = 0.0,
    ) -> dict[str, str]:
        """The controller's verdict on each node of ``job`` and of ``nodes``, asked now:
        ``alive``, ``silent`` (no verdict yet), ``suspected``, ``moved`` (the job's slot
        left it), ``dead`` (by Ray, or fenced) or ``unknown`` (its calls are refused
        there, or it suspects itself: Ray decides). Given the verdicts held already
        (``unless``), the answer comes as soon as one differs, or after ``wait_s``."""
        request = NodesOf(job, tuple(sorted(set(nodes or []))), unless, wait_s)
        return self.call("verdicts", request)

    def release(self, job: str, force: bool = False) -> bool:
        """Release ``job`` (cancelling a reserve of it in progress); True if it existed.
        Returns once Ray reports every group gone. Idempotent. Another client's
        reservation needs ``force``."""
        return self.call("release", Owned(job=job, token=self.token, force=force))

    def release_all(self, force: bool = False) -> list[str]:
        """Release this client's reservations (everyone's with ``force``)."""
        return self.call("release_all", Everyone(token=self.token, force=force))

    def repair(self, job: str, force: bool = False) -> ReservationInfo:
        """Replace the lost slots of ``job`` now (see ``repair="manual"``)."""
        return _INFO.decode(self.call("repair", Owned(job=job, token=self.token, force=force)))

    def stop(self) -> None:
        """Stop the controller actor (its loop ends and its last events are written,
        then the actor is killed). Reservations and their groups stay; a new controller
        picks them up from the table."""
        with contextlib.suppress(Exception):  # a controller that does not answer is killed
            ray.get(self._actor().stop.remote(), timeout=10)
        ray.kill(self._actor(), no_restart=True)


__all__ = [
    "Controller",
    "Reservation",
    "ReservationCancelled",
    "connect",
]
