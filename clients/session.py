"""Attaching to the controller and using reservations from a driver."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

import msgspec
import ray

from clients.changes import ChangeClient, unwrap
from clients.driver_table import RayTable
from clients.owner_token import resolve_token
from clients.queue import QueueClient
from clients.reservation import Reservation
from clients.versions import check_ray_version, warn_if_versions_differ
from controller import ClusterSpec, PlacementError, load_spec
from controller.errors import (
    ReservationCancelled,
    TableUnreadable,
    UnknownReservation,
)
from controller.runtime.io import HEAD_RESOURCE
from controller.state.published import ComponentBlock
from controller.state.records import AUTO, ReservationRecord
from controller.state.requests import check_job
from controller.state.status import ReservationInfo
from controller.state.table import (
    LEGACY_KEY,
    META,
    RECORD,
    check_meta,
    component_key,
    decode,
    key,
)

DEFAULT_NAME = "placectl"
DEFAULT_NAMESPACE = "placectl"
_INFO = msgspec.msgpack.Decoder(ReservationInfo)
_INFOS = msgspec.msgpack.Decoder(list[ReservationInfo])


def connect(
    address: str | None = None,
    start: bool = True,
    name: str = DEFAULT_NAME,
    namespace: str = DEFAULT_NAMESPACE,
    token: str | None = None,
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

    Returns:
        A handle; it works from any Ray namespace.

    Raises:
        PlacementError: no controller exists and ``start`` is False.
    """
    check_ray_version(ray.__version__)
    if not ray.is_initialized():
        ray.init(address=address)
    try:
        handle = ray.get_actor(name, namespace=namespace)
        created = False
    except ValueError:
        if not start:
            raise PlacementError(
                f"no placectl controller named {name!r} in namespace {namespace!r}; start one "
                "with `placectl start` or connect(start=True)"
            ) from None
        from controller.runtime.controller import PlacementController

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
            )
            .remote(name)
        )
        created = True
    ctl = Controller(handle, name, namespace, token=token)
    if created:
        ctl.check_alive()  # surface a controller that cannot start, here and now
    return ctl


class Controller(ChangeClient, QueueClient):
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
        self.handle = handle
        self.name = name
        self.namespace = namespace
        self._table = table if table is not None else RayTable(name)
        self._token = token
        self._version_checked = False

    @property
    def token(self) -> str:
        """The owner token this client sends with every change (resolved on first use)."""
        if not self._token:
            self._token = resolve_token()
        return self._token

    def _actor(self) -> Any:
        """The controller actor's handle, looked up on first use by a Controller made
        for reading the table only."""
        if self.handle is None:
            self.handle = ray.get_actor(self.name, namespace=self.namespace)
        return self.handle

    def call(self, method: str, *args: Any, timeout: float | None = None, **kw: Any) -> Any:
        """Call one of the controller actor's methods and wait; a PlacementError it
        raises is raised here as itself."""
        try:
            out = self._call_once(method, args, kw, timeout)
        except ray.exceptions.ActorDiedError:
            if not self._found_anew():
                raise
            out = self._call_once(method, args, kw, timeout)  # calls are idempotent
        if not self._version_checked:  # once per client, after its first call answered
            self._version_checked = True
            with contextlib.suppress(Exception):  # a check, never a reason for a call to fail
                health = out if method == "health" else self.call("health")
                warn_if_versions_differ(health.get("version", "unknown"))
        return out

    def _call_once(self, method: str, args: tuple, kw: dict, timeout: float | None) -> Any:
        ref = getattr(self._actor(), method).remote(*args, **kw)
        return unwrap(lambda: ray.get(ref, timeout=timeout))

    def _found_anew(self) -> bool:
        """The controller this handle named was stopped and another started under its
        name (an upgrade: `placectl stop`, `placectl start`): use the new one."""
        try:
            new = ray.get_actor(self.name, namespace=self.namespace)
        except ValueError:
            return False
        if self.handle is not None and new._actor_id == self.handle._actor_id:
            return False
        self.handle = new
        return True

    def check_alive(self) -> str:
        """Round-trip to the controller; returns its incarnation id (new on each restart)."""
        return self.call("check_alive")

    def health(self) -> dict[str, Any]:
        """The controller's incarnation, whether it has recovered, and why it refuses to
        act if it does (an unreadable table)."""
        return self.call("health")

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
        ref = self._actor().reserve.remote(
            job,
            spec,
            timeout_s,
            replace,
            repair,
            queue,
            priority,
            self.token,
            force,
            preemptible,
            preempt_grace_s,
        )
        try:
            self._follow(ref, job, progress)
        except KeyboardInterrupt:
            ray.get(self.handle.cancel.remote(job), timeout=60)
            raise
        info = _INFO.decode(unwrap(lambda: ray.get(ref)))
        return Reservation(self, info)

    def _follow(self, ref, job: str, progress: Callable[[str], None] | None) -> None:
        """Wait for a call, passing what the controller says it waits for to
        ``progress`` (default: stderr) whenever that changes."""
        say = progress or (lambda m: print(f"placectl: {job}: {m}", file=sys.stderr, flush=True))
        last = ""
        while not ray.wait([ref], timeout=1.0)[0]:
            try:
                message = ray.get(self.handle.progress.remote(job), timeout=5)
            except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
                continue
            if message and message != last:
                say(message)
                last = message

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
        return _INFO.decode(self.call("status", job))

    def list(self) -> list[ReservationInfo]:
        return _INFOS.decode(self.call("list"))

    def suspects(self, job: str) -> list[str]:
        """The nodes of ``job`` whose raylets do not answer and that the controller has
        not fenced yet; asking fences a node whose raylet refuses connections."""
        return self.call("suspects", job)

    def release(self, job: str, force: bool = False) -> bool:
        """Release ``job`` (cancelling a reserve of it in progress); True if it existed.
        Returns once Ray reports every group gone. Idempotent. Another client's
        reservation needs ``force``."""
        return self.call("release", job, self.token, force)

    def release_all(self, force: bool = False) -> list[str]:
        """Release this client's reservations (everyone's with ``force``)."""
        return self.call("release_all", self.token, force)

    def repair(self, job: str, force: bool = False) -> ReservationInfo:
        """Replace the lost slots of ``job`` now (see ``repair="manual"``)."""
        return _INFO.decode(self.call("repair", job, self.token, force))

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
