"""Attaching to the controller and using reservations from a driver."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec
import ray

from controller import ClusterSpec, PlacementError, load_spec
from controller.reservations import (
    TABLE_KEY,
    Assignment,
    ReservationError,
    ReservationRecord,
    ReservationTimeout,
    Table,
    UnknownReservation,
    build_assignments,
    check_job,
    decode_table,
    kv_namespace,
    plan_of,
)
from controller.status import ReservationInfo, summarize

DEFAULT_NAME = "placectl"
DEFAULT_NAMESPACE = "placectl"
_INFO = msgspec.msgpack.Decoder(ReservationInfo)
_INFOS = msgspec.msgpack.Decoder(list[ReservationInfo])


def _unwrap(fn: Callable[[], Any]) -> Any:
    """Run a Ray call; a PlacementError raised in the controller re-raises as itself."""
    try:
        return fn()
    except ray.exceptions.RayTaskError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, PlacementError):
            raise cause from None
        raise


def _init_ray(address: str | None) -> None:
    if ray.is_initialized():
        return
    ray.init(
        address=address,
        namespace=DEFAULT_NAMESPACE,
        logging_level="WARNING",
        log_to_driver=False,
        configure_logging=True,
    )


def connect(
    address: str | None = None,
    start: bool = True,
    name: str = DEFAULT_NAME,
    namespace: str = DEFAULT_NAMESPACE,
) -> Controller:
    """Attach to the cluster's controller, starting it if needed.

    Args:
        address: Ray address (``"auto"`` for a running cluster). With ``None`` and no
            cluster running, Ray starts a local instance. Ignored if Ray is initialised.
        start: create the controller if it does not exist. Two drivers starting it at
            once get the same one.
        name, namespace: the controller actor's name and namespace.

    Returns:
        A handle; it works from any Ray namespace.

    Raises:
        PlacementError: no controller exists and ``start`` is False.
    """
    _init_ray(address)
    try:
        handle = ray.get_actor(name, namespace=namespace)
        created = False
    except ValueError:
        if not start:
            raise PlacementError(
                f"no placectl controller named {name!r} in namespace {namespace!r}; start one "
                "with `placectl start` or connect(start=True)"
            ) from None
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from controller.actor import PlacementController
        from controller.raylib import head_node_id

        head = head_node_id()
        strategy = NodeAffinitySchedulingStrategy(head, soft=True) if head else "DEFAULT"
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
                max_concurrency=1000,
                scheduling_strategy=strategy,
            )
            .remote(name)
        )
        created = True
    ctl = Controller(handle, name, namespace)
    if created:
        ctl.check_alive()  # surface a controller that cannot start, here and now
    return ctl


class Controller:
    """A driver's handle to the controller. Every method is a call to the actor."""

    def __init__(self, handle: Any, name: str = DEFAULT_NAME, namespace: str = DEFAULT_NAMESPACE):
        self.handle = handle
        self.name = name
        self.namespace = namespace

    def check_alive(self) -> str:
        """Round-trip to the controller; returns its incarnation id (new on each restart)."""
        return _unwrap(lambda: ray.get(self.handle.check_alive.remote()))

    def reserve(
        self,
        job: str,
        spec: Any,
        timeout_s: float = 300.0,
        replace: bool = False,
        progress: Callable[[str], None] | None = None,
    ) -> Reservation:
        """Reserve ``spec`` (a path, YAML, dict or ClusterSpec) for ``job``.

        Idempotent: the same job and spec returns the existing reservation. While the
        controller waits for resources, what it is waiting for is passed to ``progress``
        (default: printed to stderr) every time it changes.

        Raises:
            PlacementError: the configuration does not fit the cluster.
            ReservationTimeout: not satisfied within ``timeout_s``; nothing is left behind.
            ReservationConflict: ``job`` is reserved with another spec and not ``replace``.
        """
        spec = spec if isinstance(spec, ClusterSpec) else load_spec(spec)
        say = progress or (lambda m: print(f"placectl: {job}: {m}", file=sys.stderr, flush=True))
        ref = self.handle.reserve.remote(job, spec, timeout_s, replace)
        last = ""
        while not ray.wait([ref], timeout=1.0)[0]:
            try:
                message = ray.get(self.handle.progress.remote(job), timeout=5)
            except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
                continue
            if message and message != last:
                say(message)
                last = message
        info = _INFO.decode(_unwrap(lambda: ray.get(ref)))
        return Reservation(self, info)

    def reservation(self, job: str) -> Reservation:
        """Attach to an existing reservation.

        Reads the persisted table straight from the GCS key-value store, so attaching
        costs one GCS read and no call to the controller.
        """
        return Reservation(self, self.record(job))

    def table(self) -> Table:
        """The persisted reservation table, read from the GCS key-value store."""
        from ray.experimental import internal_kv

        data = internal_kv._internal_kv_get(TABLE_KEY, namespace=kv_namespace(self.name))
        return decode_table(data)

    def record(self, job: str) -> ReservationRecord:
        """The stored record of ``job``."""
        check_job(job)
        records = self.table().reservations
        if job not in records:
            known = ", ".join(sorted(records)) or "none"
            raise UnknownReservation(f"no reservation named {job!r} (reserved: {known})")
        return records[job]

    def status(self, job: str) -> ReservationInfo:
        return _INFO.decode(_unwrap(lambda: ray.get(self.handle.status.remote(job))))

    def list(self) -> list[ReservationInfo]:
        return _INFOS.decode(_unwrap(lambda: ray.get(self.handle.list.remote())))

    def release(self, job: str) -> bool:
        """Release ``job``; True if it existed. Idempotent."""
        return _unwrap(lambda: ray.get(self.handle.release.remote(job)))

    def release_all(self) -> list[str]:
        return _unwrap(lambda: ray.get(self.handle.release_all.remote()))

    def stop(self) -> None:
        """Kill the controller actor. Reservations and their groups stay; a new
        controller picks them up from the persisted table."""
        ray.kill(self.handle, no_restart=True)


class Reservation:
    """A driver's view of one reservation.

    Assignments are computed in the driver from the stored record (the same function
    the controller uses), so looking them up never queues behind other drivers.
    """

    def __init__(self, controller: Controller, source: ReservationRecord | ReservationInfo):
        self.controller = controller
        self._record: ReservationRecord | None = None
        self._built: dict[str, list[Assignment]] = {}
        if isinstance(source, ReservationRecord):
            self._adopt(source)
        else:
            self.info = source

    def _adopt(self, record: ReservationRecord) -> None:
        cp = plan_of(record)
        self._record = record
        self._plan = cp
        self._built = {}
        self.info = summarize(record, {n: cp.world_size(n) for n in cp.components})

    @property
    def job(self) -> str:
        return self.info.job

    @property
    def epoch(self) -> int:
        return self.info.epoch

    @property
    def components(self) -> list[str]:
        return list(self.info.components)

    def refresh(self) -> ReservationInfo:
        """Re-read the stored record (state, epoch, slots)."""
        record = self.controller.record(self.job)
        if self._record is None or record.epoch != self._record.epoch:
            self._adopt(record)
        else:
            self._record = record
            self.info = summarize(record, self.info.components)
        return self.info

    def assignments(self, component: str) -> list[Assignment]:
        """Each rank's :class:`Assignment` for ``component``, in rank order, as of the
        reservation's current epoch (one GCS read; rebuilt only when the epoch moved)."""
        self.refresh()
        if self.info.state not in ("ready", "degraded"):
            raise ReservationError(
                f"reservation {self.job!r} is {self.info.state}; assignments need ready"
            )
        if component not in self.info.components:
            raise PlacementError(
                f"unknown component {component!r} in {self.job!r}; it has "
                f"{', '.join(self.info.components)}"
            )
        if not self._built:
            self._built = build_assignments(self._record, self._plan)
        return self._built[component]

    def release(self) -> bool:
        return self.controller.release(self.job)

    def lease_ports(
        self,
        component: str,
        rank: int = 0,
        count: int = 1,
        consecutive: bool = True,
        name: str | None = None,
    ) -> list[int]:
        """Lease ``count`` ports on the node of ``component``'s ``rank``.

        Each call returns ports not returned before while they are leased (concurrent
        callers included), checked free on that node; ``consecutive`` asks for an
        unbroken run (inference engines often need one). With ``name`` the call is
        idempotent. Leases end with the reservation or :meth:`release_ports`.
        """
        handle = self.controller.handle
        return _unwrap(
            lambda: ray.get(
                handle.lease_ports.remote(self.job, component, rank, count, consecutive, name)
            )
        )

    def release_ports(self, ports: list[int]) -> int:
        """End the leases holding any of ``ports``; master ports stay."""
        return _unwrap(
            lambda: ray.get(self.controller.handle.release_ports.remote(self.job, list(ports)))
        )

    def wait_ready(self, timeout: float = 60.0, poll_s: float = 0.25) -> ReservationInfo:
        """Block until the reservation is ready; raise ReservationTimeout otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.refresh()
            if info.state == "ready":
                return info
            if time.monotonic() >= deadline:
                raise ReservationTimeout(
                    f"reservation {self.job!r} is still {info.state} after {timeout:g}s: "
                    f"{info.reason}"
                )
            time.sleep(poll_s)
