"""The controller's calls that change nothing, and the gate every call passes.

**Readiness**: whether the controller may act: it has recovered, and its table can be
read.

**Reads**: the calls that read reservations: ``status``, ``list``, ``suspects``,
``verdicts``, ``assignments``, ``component``, ``standbys``. What they answer is
confirmed against Ray first: never ``ready`` while Ray reports a node of the reservation
dead.

**Diagnostics**: the calls that report on the controller itself: what a call in
progress waits for, liveness, health, and the hooks tests and benchmarks use. They answer
even while the controller refuses to act.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec

from controller import version
from controller.errors import PlacementError, ReservationError, TableUnreadable
from controller.runtime import core
from controller.runtime.core.settings import changed
from controller.runtime.edge.answers import TEST_HOOKS
from controller.runtime.steps import Operations
from controller.runtime.steps.checks import Checker
from controller.state import verdicts as vd
from controller.state.published import summarize
from controller.state.records import ReservationRecord
from controller.state.requests import ComponentOf, Fault, JobOf, NodesOf
from controller.state.standbys import standby_assignments
from controller.state.table import where

log = logging.getLogger("placectl.controller")

RECOVERY_WAIT_S = 60.0
# How often a verdicts call that waits for a change reads the node view again: a read of
# memory, and the delay a driver waiting for a suspect's slot to move adds to its repair.
VERDICT_POLL_S = 0.05


class Readiness:
    """The gate every call but the diagnostic ones passes.

    Attributes:
        recovered: set once recovery ended (with the table read, or refused).
        refusal: why the table cannot be read (None: it can, or recovery has not ended).
        problem: the last reason recovery failed, told to calls that time out on it.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self.recovered = asyncio.Event()
        self.refusal: str | None = None
        self.problem = ""

    def accept(self) -> None:
        if self.refusal is not None:
            log.warning("the reservation table is readable again; acting on it")
        self.refusal = None
        self.recovered.set()

    def refuse(self, why: str) -> None:
        """Refuse every call with ``why`` (calls answer now: with the refusal)."""
        if why != self.refusal:
            log.error("refusing to act: the reservation table cannot be read: %s", why)
        self.refusal = why
        self.recovered.set()

    async def wait(self) -> None:
        """Wait for recovery (at most ``RECOVERY_WAIT_S``); refuse while the table cannot
        be read."""
        if not self.recovered.is_set():
            try:
                await asyncio.wait_for(self.recovered.wait(), RECOVERY_WAIT_S)
            except asyncio.TimeoutError:
                raise ReservationError(
                    f"the controller has not recovered after {RECOVERY_WAIT_S:g}s: {self.problem}"
                ) from None
        if self.refusal is not None:
            raise TableUnreadable(
                f"placectl refuses to act because the reservation table cannot be read: "
                f"{self.refusal}. Nothing was removed; run a placectl that reads it, or "
                f"remove the unreadable keys ({where(self._name)})"
            )


def status_bytes(checker: Checker, res: ReservationRecord) -> bytes:
    """The encoded :class:`ReservationInfo` of ``res`` as Ray last reported its nodes."""
    return msgspec.msgpack.encode(summarize(checker.truthful(res)))


class ReadCalls:
    """Answers the calls that read reservations, each given its checked request."""

    def __init__(self, ops: Operations) -> None:
        self._ops = ops
        self._state = ops.ctx.state

    async def _settled(self, job: str) -> ReservationRecord:
        await self._ops.checker.confirm([job])
        res = self._state.require(job)
        if not res.settled:
            raise ReservationError(f"reservation {job!r} is {res.state}; assignments need ready")
        return res

    async def assignments(self, call: ComponentOf) -> bytes:
        """The msgpack-encoded ``list[Assignment]`` of one component, in rank order."""
        await self._settled(call.job)
        encoded = await self._state.encoded(call.job)
        if call.component not in encoded:
            raise PlacementError(
                f"unknown component {call.component!r} in {call.job!r}; it has {', '.join(encoded)}"
            )
        return encoded[call.component]

    async def component(self, call: ComponentOf) -> bytes:
        """The msgpack-encoded :class:`ComponentBlock` of ``job``'s current epoch."""
        await self._settled(call.job)
        published = await self._state.published(call.job)
        if call.component not in published.components:
            raise PlacementError(f"unknown component {call.component!r} in {call.job!r}")
        return msgspec.msgpack.encode(published.components[call.component])

    async def standbys(self, call: ComponentOf) -> bytes:
        """The msgpack-encoded ``list[Assignment]`` the standby processes of one
        component start with on ``job``'s held spares (empty when it holds none)."""
        res = await self._settled(call.job)
        if call.component not in res.world_sizes:
            raise PlacementError(
                f"unknown component {call.component!r} in {call.job!r}; it has "
                f"{', '.join(res.world_sizes)}"
            )
        plan = (await self._state.plan(call.job)).plan
        return msgspec.msgpack.encode(standby_assignments(res, plan, call.component))

    async def status(self, call: JobOf) -> bytes:
        """The encoded :class:`ReservationInfo` of ``job``: never ``ready`` while Ray
        reports one of its nodes dead, nor while one of its raylets refuses connections
        (the node is fenced first, see :mod:`controller.runtime.steps.liveness`), nor
        while one of them is suspected."""
        await self._suspect(call.job)
        return status_bytes(self._ops.checker, self._state.require(call.job))

    async def _suspect(self, job: str, also: set[str] = frozenset()) -> dict[str, str]:
        """Ask the raylets of ``job``'s nodes (and of ``also``) now; the verdict on each
        of them (:mod:`controller.state.verdicts`)."""
        res = self._state.get(job)
        holds = res.node_ids() if res is not None and res.settled else set()
        await self._ops.liveness.check_now(holds | set(also))
        await self._ops.checker.confirm([job])
        res = self._state.get(job)
        holds = res.node_ids() if res is not None else set()
        return self._ops.liveness.verdicts(holds | set(also), holds)

    async def suspects(self, call: JobOf) -> list[str]:
        """The nodes of ``job`` whose raylets do not answer now and that are not judged
        yet (each is suspected once silent for ``settings.suspect_after`` and confirmed
        by witnesses, and its slots move); a refusing one is fenced by this call once a
        second path confirms the refusal."""
        verdicts = await self._suspect(call.job)
        return sorted(n for n, v in verdicts.items() if v == vd.SILENT)

    async def verdicts(self, call: NodesOf) -> dict[str, str]:
        """The controller's verdict on each node of ``job`` and each of ``nodes`` (the
        nodes a driver's ranks ran on), after asking their raylets now: ``alive``,
        ``silent`` (no verdict yet), ``suspected`` (the job's slot there moves now),
        ``moved`` (the job's slots left the node: its ranks there are lost), ``dead``
        (Ray reports it dead, it was fenced, or its death is proven) or ``unknown``
        (placectl's calls are refused there, or the controller suspects itself: Ray's
        verdict decides). What a driver's ``repair()`` waits on
        (:mod:`controller.state.verdicts`).

        With ``unless`` (the verdicts the caller holds), the answer comes as soon as one
        differs, or after ``wait_s``: a driver waiting for a suspect's slot to move
        learns of the move in milliseconds, not at its next sweep of its own (a silent
        raylet takes a second to time out). The watch asks every watched node all along;
        this call only reads what it concluded."""
        if call.unless is None:
            return dict(sorted((await self._suspect(call.job, set(call.nodes))).items()))
        deadline = core.now() + call.wait_s
        while True:
            held = self._held(call.job, set(call.nodes))
            if held != call.unless or core.now() >= deadline:
                return held
            await asyncio.sleep(min(VERDICT_POLL_S, max(deadline - core.now(), 0.0)))

    def _held(self, job: str, also: set[str]) -> dict[str, str]:
        """The verdicts on ``job``'s nodes and ``also`` from what is known now, asking no
        raylet (the facts posted since the loop's last tick applied first)."""
        self._ops.ctx.nodes.settle()
        res = self._state.get(job)
        holds = res.node_ids() if res is not None else set()
        return dict(sorted(self._ops.liveness.verdicts(holds | also, holds).items()))

    async def list(self) -> bytes:
        """Encoded ``list[ReservationInfo]`` of every reservation, by job name."""
        records = self._state.records
        await self._ops.checker.confirm(list(records))
        checker = self._ops.checker
        return msgspec.msgpack.encode(
            [summarize(checker.truthful(records[j])) for j in sorted(records)]
        )


class DiagnosticCalls:
    """Answers ``progress``, ``check_alive``, ``health``, ``arm_fault``, ``timings`` and
    ``group_prefix``."""

    def __init__(self, ops: Operations, readiness: Readiness) -> None:
        self._ops = ops
        self._ctx = ops.ctx
        self._readiness = readiness

    async def progress(self, call: JobOf) -> str:
        """What a reservation in progress is waiting for ("" when nothing)."""
        return self._ctx.progress.of(call.job)

    async def check_alive(self) -> str:
        """Answers this incarnation's id, which changes on every restart."""
        return self._ctx.incarnation.id

    async def health(self) -> dict[str, Any]:
        """Version, incarnation, node, recovery, refusal, how node events arrive, GCS
        store, fenced nodes, the nodes in doubt (``doubts``: node id -> its phase, since
        when, why, how many reservations' leftovers it owes), who refuses placectl's own
        calls (``denied``: node id or
        ``gcs`` -> why), the fences that failed, whether the controller suspects itself
        (``cut_off``: it reaches no majority of the nodes it asks), the nodes an
        operator cordoned (``cordoned``: node id -> what and why), the steps the
        reservations' stewards run and hold (``steps``: job -> the trigger of the step
        running, then of those waiting), and the settings that differ from the defaults."""
        io = self._ctx.io
        self._ctx.nodes.settle()  # the facts posted since the loop's last tick
        return {
            "version": version(),
            "incarnation": self._ctx.incarnation.id,
            "node_id": io.own_node(),
            "recovered": self._readiness.recovered.is_set(),
            "refusal": self._readiness.refusal,
            "reservations": len(self._ctx.state.records),
            "node_events": io.watching(),
            "gcs_store": io.gcs_store(),
            "fenced": dict(self._ops.fencer.fenced),
            "doubts": {
                n: {"phase": r.phase.value, "since": r.since, "why": r.why, "owed": len(r.owed)}
                for n, r in self._ctx.nodes.in_doubt().items()
            },
            "denied": dict(self._ops.fencer.denied),
            "fence_failures": self._ops.fencer.failures,
            "cut_off": self._ops.liveness.cut_off,
            "cordoned": {n: c.shown() for n, c in self._ctx.state.cordons.items()},
            "steps": self._ctx.stewards.doing(),
            "settings": changed(self._ctx.settings),
        }

    # ------------------------------------------------------------ testing
    async def arm_fault(self, call: Fault) -> None:
        """Test only: crash the next time ``step`` is reached. Refused unless the
        controller was started with its test hooks (``Settings.test_hooks``)."""
        if not self._ctx.settings.test_hooks:
            raise ReservationError(
                f"arm_fault({call.step!r}) is a test hook: this controller was not started "
                f"for tests ({TEST_HOOKS}=1 in its environment, as placectl's test clusters "
                "set it); nothing was armed"
            )
        self._ctx.incarnation.arm(call.step)

    async def timings(self) -> dict[str, float]:
        """How long the last new reservation took to plan, place and probe."""
        return dict(self._ops.reserver.last_timings)

    async def group_prefix(self) -> str:
        """The name prefix of this controller's placement groups."""
        return self._ctx.prefix


__all__ = ["DiagnosticCalls", "ReadCalls", "status_bytes"]
