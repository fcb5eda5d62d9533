"""Held spares: a reservation with ``cluster.spares: N`` holds N whole nodes of its
slots' kind, each as one placement group with the bundles of one node's slots, so that a
repair finds its replacement already placed and probed (:mod:`controller.runtime.steps.repair`
makes a held group a slot; :func:`controller.state.spares.held_for` says which).

Guarantees:

* A held spare is on a live node of the same kind as the reservation's nodes, matching
  their node-group selectors, not draining, outside the reservation, its group placed and
  its devices probed. One that stops being so (its node died or drains, Ray removed its
  group, an apply changed the node's shape) is dropped and another taken.
* Holding never delays or degrades the reservation: it runs only while the reservation is
  ``ready`` and nothing else of the job is in progress, in a step of the job's steward,
  and a spare that cannot be had now is taken when a node joins or after
  ``settings.repair_retry``.
* A spare no free node can be is asked of the cluster's autoscaler, as a repair asks for
  its spare (one node of the kind per spare missing, demand key ``hold/<job>``); the node
  that joins for it is held at the next step, and the demand withdrawn once every spare
  is held, or the reservation is gone or wants fewer.
* A group it is making is never an orphan (:meth:`Holder.making`), and one it made for a
  step that failed is removed before the step ends.
* The free nodes it takes are claimed before it makes their groups
  (:mod:`controller.runtime.core.claims`): a repair choosing a spare meanwhile never
  takes the same room.
"""

from __future__ import annotations

import logging
import secrets

from controller.runtime import core
from controller.runtime.core import groups
from controller.runtime.core.context import Context
from controller.runtime.core.stewards import Trigger
from controller.runtime.edge import CREATED
from controller.state.queueing import usage
from controller.state.records import AUTO, DEGRADED, READY, ReservationRecord, SlotRecord
from controller.state.spares import (
    apart_from,
    choose_spare,
    copied_rank,
    need_of,
    segments_kept,
    selectors_for,
    shape,
    spare_bundles,
    spare_ranks,
)
from controller.state.wants import for_spare

log = logging.getLogger("placectl.controller")

HOLD = "hold"  # the demand key's kind: hold/<job>, spares asked of the autoscaler


class _GivenUp(Exception):
    """The spares just made are given up: a repair needs their nodes."""


class Holder:
    """Keeps each ready reservation's held spares at its ``cluster.spares``."""

    def __init__(self, ctx: Context) -> None:
        self._io, self._state, self._nodes = ctx.io, ctx.state, ctx.nodes
        self._stewards = ctx.stewards
        self._records = ctx.records
        self.settings = ctx.settings
        self._prefix = ctx.prefix
        self._tasks, self._demand = ctx.tasks, ctx.demand
        self._claims = ctx.claims
        self._after: dict[str, float] = {}  # job -> when it may be tried again
        self._making: dict[str, set[str]] = {}  # job -> names of groups being made
        self._short: dict[str, str] = {}  # job -> why it holds fewer (logged once)
        # job -> the reservation (its uid) the entries above are about: a job name
        # reserved again after a release starts with none of them.
        self._uid: dict[str, str] = {}

    def making(self) -> set[str]:
        """Names of spare groups being made (not orphans)."""
        return {n for names in self._making.values() for n in names}

    def retry_now(self) -> None:
        """A node joined: a spare may be had now."""
        self._after.clear()

    def keep_only(self, jobs: set[str]) -> None:
        """Forget what is known of every job not in ``jobs`` (released)."""
        for known in (self._after, self._short, self._uid):
            for job in set(known) - jobs:
                del known[job]

    def _own(self, res: ReservationRecord) -> None:
        """Drop what is known of an earlier reservation of ``res``'s job name."""
        if self._uid.get(res.job) != res.uid:
            self._after.pop(res.job, None)
            self._short.pop(res.job, None)
            self._uid[res.job] = res.uid

    def due(self, res: ReservationRecord) -> bool:
        """Whether ``res`` should take or drop a held spare now (what was known of an
        earlier reservation of its name forgotten first)."""
        if not res.spec.spares and not res.spares:
            return False  # the common case, every tick: nothing to look at
        self._own(res)
        if res.state != READY or res.repair != AUTO or res.applying is not None:
            return False
        if core.now() < self._after.get(res.job, 0.0):
            return False
        return len(res.spares) != res.spec.spares or bool(self._unfit(res))

    def schedule(self, job: str) -> None:
        self._tasks.start("hold", job, self.hold(job))

    def _unfit(self, res: ReservationRecord, table: dict | None = None) -> set[int]:
        """Indexes of held spares to drop: on a node gone, draining or suspected, inside the
        reservation, of another shape than its nodes now have, or (``table``: Ray's
        entries of their groups) whose group is not placed, or copying a node rank the
        reservation has no more."""
        inside, ranks = res.node_ids(), {s.node_rank for s in res.slots}
        away = set(self._nodes.draining) | self._nodes.suspected()
        out = set()
        for i, s in enumerate(res.spares):
            gone = s.node_id not in self._nodes or s.node_id in away or s.node_id in inside
            placed = table is None or (s.group_id in table and table[s.group_id].state == CREATED)
            _, bundles = spare_bundles(res, copied_rank(res, s))
            stale = s.copies >= 0 and s.copies not in ranks
            if gone or not placed or stale or shape(s.bundles) != shape(bundles):
                out.add(i)
        return out

    async def hold(self, job: str) -> None:
        """One step: drop the unfit held spares, take the missing ones (as many as free
        nodes allow), write the record, then remove the dropped groups."""
        dropped: set[str] = set()

        async def step() -> None:
            res = self._state.get(job)
            if res is None or not self.due(res):
                return
            table = await self._io.groups(sorted(s.group_id for s in res.spares if s.group_id))
            unfit = self._unfit(res, table)
            # Each spare copies a node of one kind (spare_ranks): the fit ones whose kind
            # is still wanted stay, the kinds missing are taken.
            wanted = spare_ranks(res, (await self._state.plan(job)).plan)
            kept, missing = [], list(wanted)
            for i, s in enumerate(res.spares):
                rank = copied_rank(res, s)
                if i in unfit or rank not in missing:
                    unfit.add(i)
                    continue
                missing.remove(rank)
                kept.append(s)
            fresh = await self._take(res, kept, missing)
            short = self._short.get(job, "")
            same = not unfit and not fresh and len(kept) <= res.spec.spares
            if same and short == res.spares_short:
                return
            spares = (kept + fresh)[: res.spec.spares]
            try:
                await self._records.held(res, spares, short)
            except BaseException:
                dropped.update(s.group_id for s in fresh)  # never recorded: not held
                raise
            dropped.update(s.group_id for s in res.spares + fresh if s not in spares)
            log.info(
                "reservation %r holds %d of %d spares (%s)",
                job,
                len(spares),
                res.spec.spares,
                ", ".join(s.node_ip for s in spares) or "none",
            )

        try:
            await self._stewards.run(job, Trigger.HOLD, step)
        except Exception as e:
            log.warning("holding spares for %r failed, will retry: %s", job, e)
            self._after[job] = core.now() + self.settings.repair_retry
        finally:
            self._making.pop(job, None)
            self._claims.release(f"{HOLD}/{job}")
        left = await groups.remove_verified(self._io, dropped, self.settings.removal_timeout)
        if left:
            log.warning("dropped spares of %r not removed yet: %s", job, sorted(left))

    def _quota_room(self, res: ReservationRecord, need: dict[str, float]) -> int | None:
        """How many more spares of ``need`` the quota of ``res``'s queue leaves room for
        (what its placed reservations and held spares use counted), or None without one."""
        limits = self._state.quotas.get(res.queue) if res.queue else None
        if not limits:
            return None
        used = next(
            (u.used for u in usage(self._state.records.values(), self._state.quotas, core.wall())
             if u.queue == res.queue),
            {},
        )  # fmt: skip
        fits = [
            int((limit - used.get(k, 0.0)) // need[k] + 1e-9)
            for k, limit in limits.items()
            if need.get(k, 0.0) > 0
        ]
        return max(0, min(fits)) if fits else None

    def _repairs_first(self, res: ReservationRecord, holds: int) -> bool:
        """Whether another reservation is degraded and repairs itself: the free nodes
        are its first (a spare is insurance, its loss is now), so ``res`` takes no new
        spare until no repair waits (said, and tried again after ``repair_retry``)."""
        waiting = sorted(
            r.job for r in self._state.records.values()
            if r.job != res.job and r.state == DEGRADED and r.repair == AUTO
        )  # fmt: skip
        if not waiting:
            return False
        quoted = ", ".join(map(repr, waiting))
        self._say_short(res, holds, f"the repair of {quoted} comes first; tried again after")
        self._after[res.job] = core.now() + self.settings.repair_retry
        return True

    def _say_short(self, res: ReservationRecord, holds: int, why: str) -> None:
        """Keep why ``res`` holds fewer spares than it asks, for its record (status,
        events); logged once, not at every retry."""
        if self._short.get(res.job) != why:
            log.warning(
                "reservation %r holds %d of %d spares: %s", res.job, holds, res.spec.spares, why
            )
        self._short[res.job] = why

    async def _take(self, res: ReservationRecord, kept: list[SlotRecord], ranks: list[int]) -> list:
        """New held spares on free nodes, placed and probed, one copying each node rank of
        ``ranks`` as far as free nodes allow; why there are fewer is logged once. Every
        group made is removed if this fails."""
        n = len(ranks)
        if n <= 0:
            self._short.pop(res.job, None)
            return []
        key = f"{HOLD}/{res.job}"
        await self._demand.settle(key)  # a node that joined for a spare: free to take now
        shapes = {r: spare_bundles(res, r)[1] for r in ranks}
        needs = {r: need_of(b) for r, b in shapes.items()}
        # The quota counts spares of the largest shape asked: never more than it allows.
        need = {k: max(x.get(k, 0.0) for x in needs.values()) for k in set().union(*needs.values())}
        room = self._quota_room(res, need)
        quota = ""  # why the quota keeps it below its count
        if room is not None and room < n:  # a spare is held against the quota like a slot
            quota = f"queue {res.queue!r}'s quota leaves room for {room} more"
            self._say_short(res, len(kept) + room, quota)
            self._after[res.job] = core.now() + self.settings.repair_retry
            n = room
            if n <= 0:
                return []
        if self._repairs_first(res, len(kept)):
            return []
        await self._nodes.refresh()
        draining = self._nodes.draining
        live = [
            n for n in self._nodes.view(res.spec.accelerator).nodes if n.node_id not in draining
        ]
        who = f"{HOLD}/{res.job}"
        free = self._claims.free(await self._io.free_resources(), but=who)
        taken = res.node_ids() | {s.node_id for s in kept}
        token, fresh, unmet = secrets.token_hex(3), [], []
        # Out of the job's racks while a node elsewhere will do (a rack lost takes no
        # spare with it); in the domain a kept segment needs, whatever else.
        apart = apart_from(res)
        plan = (await self._state.plan(res.job)).plan
        for k, rank in enumerate(ranks[:n]):
            keep = segments_kept(res.spec, plan, rank, res.nodes[rank])
            node = choose_spare(
                res.nodes[rank], live, free, needs[rank], taken, selectors_for(res, rank),
                keep, apart=apart,
            )  # fmt: skip
            if node is None:
                unmet.append(rank)
                continue
            taken.add(node.node_id)
            self._claims.claim(who, node.node_id, needs[rank])  # a repair's choice sees it now
            name = f"{self._prefix}{res.job}:{token}:spare{k}"
            fresh.append(
                SlotRecord(
                    node_rank=-1,
                    node_id=node.node_id,
                    node_ip=node.ip,
                    group_name=name,
                    bundles=shapes[rank],
                    copies=rank,
                )
            )
        if unmet:
            rank = unmet[0]
            wants = ", ".join(f"{k} {v:g}" for k, v in sorted(needs[rank].items()))
            why = (
                f"no other free node of the kind of node rank {rank} with {wants}; it asks "
                "the autoscaler and takes one when a node joins"
            )
            self._say_short(res, len(kept) + len(fresh), why)
            self._after[res.job] = core.now() + self.settings.repair_retry
            missing = [
                SlotRecord(node_rank=-1, node_id="", node_ip="", group_name="", bundles=shapes[r])
                for r in unmet
            ]
            view = self._nodes.alive_view(res.spec.accelerator)  # no demand lands on any
            await self._demand.want(
                key, for_spare(missing, res.nodes[rank], view, res.spec.accelerator)
            )
        else:
            if quota:
                self._short[res.job] = quota
            else:
                self._short.pop(res.job, None)
            await self._demand.withdraw(key)
        if not fresh:
            return []
        self._making[res.job] = {s.group_name for s in fresh}
        created: dict[int, str] = {}
        deadline = core.now() + self.settings.repair_timeout
        try:
            fresh = await groups.create_and_wait(
                self._io, res.job, fresh, deadline, lambda m: None, created
            )
            fresh = await groups.probe(self._io, res.job, fresh, res.spec.accelerator, deadline)
            if self._repairs_first(res, len(kept)):  # a node was lost meanwhile
                raise _GivenUp
            return fresh
        except BaseException as e:
            await groups.remove_verified(
                self._io, set(created.values()), self.settings.removal_timeout
            )
            if isinstance(e, _GivenUp):
                return []
            raise
