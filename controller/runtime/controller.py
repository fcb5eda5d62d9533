"""The placement controller: one named, detached Ray actor per cluster.

The actor is a facade: it holds the loop and the gate every call passes, and routes each
call (:func:`route`) to the object that answers its kind. What the
controller knows lives in one owner; what it does is done by its operations:

* ``state``: the mirror of the table, and the only way to change it (write ahead, one
  commit at a time per job, each on the record it read: :mod:`controller.runtime.core.state`);
* ``ops`` (:class:`Operations`): the checker, leaser, repairer, reserver (and its queue),
  applier, reconciler and the raylet watch, made once from one :class:`Context`;
* the calls: :class:`ChangeCalls`, :class:`ReadCalls`, :class:`QueueCalls`,
  :class:`NodeCalls`, :class:`DiagnosticCalls`, each given the request its call was
  checked into (:mod:`controller.state.requests`).

How a call reaches its handler: Ray hosts one class, so every call is a method of the
facade, made by :func:`route` from the handler that answers it and the request type that
names its parameters. The method takes the request's fields (by position or by name, as
Ray and tests call it, or one request built by a client), builds the request, which
checks them, waits until the controller may act, and hands the request to the handler.
So a call's parameters are written once, in its request type, and its documentation
once, on its handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
import re
from collections.abc import Callable
from typing import Any

from controller.errors import ReservationError, TableUnreadable
from controller.runtime import core
from controller.runtime.changes import ChangeCalls, NodeCalls, QueueCalls
from controller.runtime.core import Tasks
from controller.runtime.core.context import FAULT_STEPS, Context, Incarnation, SimulatedCrash
from controller.runtime.core.history import History
from controller.runtime.core.settings import Settings, from_environ
from controller.runtime.core.state import ReservationState
from controller.runtime.core.store import Store
from controller.runtime.edge import ClusterIO
from controller.runtime.reads import DiagnosticCalls, ReadCalls, Readiness
from controller.runtime.steps import Operations
from controller.runtime.steps.reconcile import Reconciler
from controller.state import lease_requests as lq
from controller.state import requests as rq
from controller.state.queueing import usage
from controller.state.records import GROUP_PREFIX
from controller.state.table import KV_NAMESPACE, kv_prefix

log = logging.getLogger("placectl.controller")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
CHANGES, READS, QUEUES, DIAGNOSTICS = "_changes", "_reads", "_queues", "_diagnostics"
NODES = "_nodes"


def route(
    owner: str,
    handler: Callable[..., Any],
    request: type | None = None,
    *,
    ready: bool = True,
) -> Callable[..., Any]:
    """A facade method answering with ``handler``, a method of the facade's attribute
    ``owner``.

    Args:
        owner: the facade attribute holding the object whose method answers.
        handler: that method, taken from its class (``QueueCalls.quotas``).
        request: the call's request type, or None for a call without parameters.
        ready: wait for recovery, and refuse while the table cannot be read, first (the
            facade's ``_ready``); False for the calls that answer regardless.
    """
    name = handler.__name__

    async def method(self, *args: Any, **kw: Any) -> Any:
        target = getattr(getattr(self, owner), name)
        if request is None:
            if args or kw:
                raise ReservationError(f"{name}() takes no arguments")
            if ready:
                await self._ready()
            return await target()
        call = build(request, name, args, kw)
        if ready:
            await self._ready()
        return await target(call)

    functools.update_wrapper(method, handler, assigned=("__name__", "__qualname__", "__doc__"))
    del method.__wrapped__  # Ray unwraps a method to read its signature: keep this one
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    if request is not None:
        params += list(inspect.signature(request).parameters.values())
    method.__signature__ = inspect.Signature(params)  # what Ray binds a call against
    return method


def build(request: type, name: str, args: tuple, kw: dict) -> Any:
    """``request`` from a call's arguments, or the one request a client sent."""
    if len(args) == 1 and not kw and isinstance(args[0], request):
        return args[0]  # checked when built (and again when Ray unpickled it)
    try:
        return request(*args, **kw)
    except TypeError as e:
        fields = ", ".join(inspect.signature(request).parameters)
        raise ReservationError(f"{name}(): {e}; it takes {fields}") from None


class PlacementController:
    """Owns every placectl reservation of a cluster.

    Fault-tolerance contract:

    * **Intent first.** Every change is written to the GCS key-value store before it is
      applied in memory and before the call returns; a write that fails changes nothing
      (the call fails, memory still equals the table). A reservation is recorded
      ``pending`` before any group exists and ``releasing`` before any is removed. The
      state owner (:class:`ReservationState`) is the only way to change anything, and
      every change of a record is one of those :mod:`~controller.runtime.core.stewards`
      names, committed on the record it was built from: the rule holds in one place.
    * **Idempotent calls.** Reserving a job again with the same spec returns it,
      releasing an absent job does nothing, a lease is found again by its name or
      request id. A client may retry any call after a restart, and Ray does so for
      calls in flight (``max_task_retries=-1``).
    * **Detached groups, remembered by id.** They outlive drivers and the controller.
      Workers belong to the drivers that launched them: a restart never stops training.
    * **Readiness is true.** No call answers ``ready`` for a reservation holding a node
      Ray reports dead: what a call reads is confirmed against Ray first.
    * **The loop starts with the actor**, not with a call: recovery, then a tick
      whenever Ray's node events arrive and at least every
      ``settings.reconcile_period`` (a lost node is marked degraded and, under the
      ``auto`` repair policy, its slot replaced), with a full check of every group every
      ``settings.full_check_period`` as a safety net. The loop never dies: a failing
      tick is logged and the next one runs.
    * **Recovery** reloads the table, rolls back ``pending`` reservations cut short,
      finishes ``releasing`` ones, clears the intent of an ``apply`` cut short, and
      removes orphans: groups with this controller's name prefix that no record
      references (also at every full check).
    * **Removal is verified**: a release is done only once Ray reports every group gone.
    * **Apply keeps what does not change**: a new configuration for a live reservation
      keeps every slot whose bundles are unchanged and every rank whose placement is; it
      is all or nothing, and a restart in the middle of it rolls it back.
    * **An unreadable table is never acted on.** A table written by a newer placectl, or
      one that cannot be decoded, makes the controller refuse every call with the reason
      and touch nothing, not even orphans; the bytes stay. It tries again every few
      seconds. Older formats are migrated.
    * **A head restart** (GCS fault tolerance) is a restart on the new head over the kept
      table; while the GCS is away its calls wait for it (bounded, ``gcs_wait``).
    * **Identity.** Every reservation has a uid, new at each creation, and an epoch that
      only grows for a job name, so drivers and workers notice any change.

    Args:
        name: the actor's name; it prefixes group names and the table's namespace.
        io: the cluster; default the real one (Ray). Unit tests pass a FakeCluster.
        settings: timing and pacing (:class:`~controller.runtime.core.settings.Settings`);
            default: the defaults, with what the process's ``PLACECTL_*`` variables set.
    """

    def __init__(
        self,
        name: str = "placectl",
        io: ClusterIO | None = None,
        settings: Settings | None = None,
    ) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ReservationError(
                f"controller name {name!r}: use letters, digits, '_', '.', '-' (no colon)"
            )
        real = io is None
        if io is None:
            from controller.runtime.edge.ray_io import RayClusterIO

            io = RayClusterIO(KV_NAMESPACE, kv_prefix(name))
        self.settings = settings or from_environ(os.environ)
        self._io = io
        self._incarnation = Incarnation(exit_process=real)
        tasks = Tasks()
        history = History(io.metrics, self.settings.events_kept)
        self._state = ReservationState(Store(io), io.metrics, history, tasks)
        prefix = f"{GROUP_PREFIX}{name}:"
        ctx = Context(io, self._state, self.settings, prefix, self._incarnation, tasks)
        self._tasks = tasks
        self._ops = ops = Operations(ctx)
        self._readiness = Readiness(name)
        self._changes = ChangeCalls(ops)
        self._reads = ReadCalls(ops)
        self._queues = QueueCalls(ops)
        self._nodes = NodeCalls(ops)
        self._diagnostics = DiagnosticCalls(ops, self._readiness)
        self._reported = float("-inf")
        self._tasks.start("loop", name, self._run())

    # ------------------------------------------------------------ the calls
    # Changes and reads wait for recovery and are refused while the table cannot be read.
    reserve = route(CHANGES, ChangeCalls.reserve, rq.Reserve)
    cancel = route(CHANGES, ChangeCalls.cancel, rq.JobOf)
    release = route(CHANGES, ChangeCalls.release, rq.Owned)
    release_all = route(CHANGES, ChangeCalls.release_all, rq.Everyone)
    apply = route(CHANGES, ChangeCalls.apply, rq.Apply)
    resize = route(CHANGES, ChangeCalls.resize, rq.Resize)
    repair = route(CHANGES, ChangeCalls.repair, rq.Owned)
    lease_ports = route(CHANGES, ChangeCalls.lease_ports, lq.LeasePorts)
    release_ports = route(CHANGES, ChangeCalls.release_ports, lq.ReleasePorts)
    lease_cores = route(CHANGES, ChangeCalls.lease_cores, lq.LeaseCores)
    status = route(READS, ReadCalls.status, rq.JobOf)
    list = route(READS, ReadCalls.list)
    suspects = route(READS, ReadCalls.suspects, rq.JobOf)
    verdicts = route(READS, ReadCalls.verdicts, rq.NodesOf)
    assignments = route(READS, ReadCalls.assignments, rq.ComponentOf)
    component = route(READS, ReadCalls.component, rq.ComponentOf)
    standbys = route(READS, ReadCalls.standbys, rq.ComponentOf)
    queue = route(QUEUES, QueueCalls.queue)
    set_quota = route(QUEUES, QueueCalls.set_quota, rq.SetQuota)
    set_operator = route(QUEUES, QueueCalls.set_operator, rq.SetOperator)
    quotas = route(QUEUES, QueueCalls.quotas)
    queues = route(QUEUES, QueueCalls.queues)
    cordon = route(NODES, NodeCalls.cordon, rq.CordonNode)
    uncordon = route(NODES, NodeCalls.uncordon, rq.UncordonNode)
    cordons = route(NODES, NodeCalls.cordons)
    # These answer from memory even while the controller refuses to act.
    events = route(QUEUES, QueueCalls.events, rq.EventsSince, ready=False)
    progress = route(DIAGNOSTICS, DiagnosticCalls.progress, rq.JobOf, ready=False)
    check_alive = route(DIAGNOSTICS, DiagnosticCalls.check_alive, ready=False)
    health = route(DIAGNOSTICS, DiagnosticCalls.health, ready=False)
    arm_fault = route(DIAGNOSTICS, DiagnosticCalls.arm_fault, rq.Fault, ready=False)
    timings = route(DIAGNOSTICS, DiagnosticCalls.timings, ready=False)
    group_prefix = route(DIAGNOSTICS, DiagnosticCalls.group_prefix, ready=False)

    # ------------------------------------------------------------ for tests, benchmarks
    @property
    def state(self) -> ReservationState:
        """The state owner (read it; change nothing through it from outside)."""
        return self._state

    @property
    def ops(self) -> Operations:
        """The operations (tests read the queue's reasons through ``ops.admitter``)."""
        return self._ops

    @property
    def reconciler(self) -> Reconciler:
        return self._ops.reconciler

    @property
    def finished(self) -> bool:
        """This incarnation crashed at a test fault or was stopped."""
        return self._incarnation.dead

    async def _ready(self) -> None:
        await self._readiness.wait()

    # ------------------------------------------------------------ lifecycle
    async def _run(self) -> None:
        ready, ops = self._readiness, self._ops
        delay = 0.5
        while not ready.recovered.is_set():
            try:
                await ops.reconciler.recover()
                ready.accept()
            except TableUnreadable as e:
                ready.refuse(str(e))
            except Exception as e:
                log.exception("recovery failed; retrying in %.1fs", delay)
                ready.problem = str(e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
        last_try = float("-inf")  # an unreadable table is read again at the first tick
        ops.liveness.start()
        while not self._incarnation.dead:
            if ready.refusal is None:
                await ops.checker.idle(self.settings.reconcile_period)
            else:  # node events go unread while refused: idle() would end at once, a spin
                await asyncio.sleep(self.settings.reconcile_period)
            try:
                self._io.metrics.table_readable(ready.refusal is None)
                if ready.refusal is None:
                    await ops.reconciler.tick()
                    await ops.admitter.tick()
                    self._report()
                elif core.now() - last_try >= self.settings.refusal_retry:
                    last_try = core.now()
                    await self._retry_unreadable()
            except Exception:
                log.exception("reconcile tick failed; the next one will run")

    def _report(self) -> None:
        """The gauges that move with time (how long the oldest has waited) and with
        quotas, every ``settings.metrics_period``."""
        now = core.now()
        if now - self._reported < self.settings.metrics_period:
            return
        self._reported = now
        records = self._state.records.values()
        self._io.metrics.queues(usage(records, self._state.quotas, core.wall()))

    async def _retry_unreadable(self) -> None:
        try:
            await self._ops.reconciler.recover()
        except TableUnreadable as e:
            self._readiness.refuse(str(e))
            return
        self._readiness.accept()

    async def stop(self) -> None:
        """Stop the loop (tests: a controller object that is discarded)."""
        self._incarnation.dead = True
        with contextlib.suppress(Exception):  # the last events, if the GCS takes them
            last = min(2.0, self.settings.removal_timeout)
            await asyncio.wait_for(self._state.write_history(), last)
        self._ops.ctx.stewards.stop()
        self._tasks.stop()


__all__ = ["FAULT_STEPS", "PlacementController", "SimulatedCrash"]
