"""Replacing slots: for a reservation whose slots are broken (or on draining nodes),
the new record with each of them made again where its cause says, on its own node or on
another of the same kind (a held spare first), its groups placed and probed. What the
repair and the drain's move share (:mod:`controller.runtime.steps.repair`), and the one
place that chooses a spare for a lost node.

Spares are chosen from Ray's free resources less what other steps claimed
(:mod:`controller.runtime.core.claims`), and each chosen node is claimed before anything
is awaited, so repairs of many jobs run at once without two of them taking the same
room. The caller lets its claims go when its step ends (:meth:`Replacer.done`).
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

import msgspec

from controller.runtime import core
from controller.runtime.core import groups
from controller.runtime.core.context import Context
from controller.runtime.core.demand import wait_free
from controller.runtime.edge import CREATED
from controller.runtime.steps.leasing import Leaser
from controller.state import spares, standbys
from controller.state.causes import DRAIN, NODE_LOST, OWN_NODE, RESPONSES
from controller.state.records import DEGRADED, READY, ReservationRecord
from controller.state.wants import Want, for_spare

log = logging.getLogger("placectl.controller")


class Replacer:
    """Makes replacement slots, and keeps the names of the groups it is making (not
    orphans: not in the table until the new record is written) and its claims."""

    def __init__(self, ctx: Context, leaser: Leaser) -> None:
        self._io, self._state, self._nodes = ctx.io, ctx.state, ctx.nodes
        self._records, self._claims = ctx.records, ctx.claims
        self._leaser, self._incarnation = leaser, ctx.incarnation
        self.settings, self._prefix, self._demand = ctx.settings, ctx.prefix, ctx.demand
        self._making: dict[str, set[str]] = {}  # job -> names of groups being made

    def making(self) -> set[str]:
        """The names of the groups being made right now."""
        return {n for made in self._making.values() for n in made}

    def done(self, job: str) -> None:
        """``job``'s step that replaced slots ended: its names and claims go."""
        self._making.pop(job, None)
        self._claims.release(f"repair/{job}")
        self._claims.release(f"move/{job}")

    async def _reclaim_wandered(self, res: ReservationRecord, table: dict, found: dict) -> None:
        """Remove, now, the groups of lost slots that Ray placed again on other nodes (a
        Ray that only hints where a group goes, 2.48), where they hold the room a spare
        needs; the record still names them until the repair writes the new one, and then
        they were to go anyway. Waits until Ray reports that room free."""
        lost = {i for i, b in found.items() if b.cause == NODE_LOST}
        moved = groups.wandered(res, table, lost)
        if not moved:
            return
        log.info(
            "%s: Ray placed the lost node's group(s) %s elsewhere: removed before choosing a spare",
            res.job,
            ", ".join(g[:12] for g in sorted(moved)),
        )
        await groups.remove_verified(self._io, set(moved), self.settings.removal_timeout)
        freed: dict[str, dict[str, float]] = {}
        for held in moved.values():
            for node, need in held.items():
                have = freed.setdefault(node, {})
                for k, v in need.items():
                    have[k] = have.get(k, 0.0) + v
        await wait_free(self._io, freed, self.settings.demand_free_wait)

    async def replace(
        self, res: ReservationRecord, holds: list, draining: dict[str, float] | None = None
    ) -> tuple[ReservationRecord | None, str, set[str], Want | None]:
        """A new record with every broken slot replaced (epoch + 1, master ports
        re-leased where they lived), the reason when there is none, the old group ids
        to remove once the new record is written, and, when lost slots have no spare,
        the nodes to ask the autoscaler for. With ``draining`` (a move), the slots on
        those nodes are replaced too, on other nodes. ``res`` is never changed, and on
        failure every group made for the attempt is removed. New master ports stay held
        in ``holds`` until the caller has written the record. A lost node's slots go to
        a held spare of their shape first (``cluster.spares``), one copying a node like
        theirs before the others (:func:`spares.spares_like`): nothing to place; but
        the slots of a node whose ranks all run short (``on_loss: continue``) go to a
        free node, leaving the spare to the standbys waiting on it, and take the spare
        only if none fits and they say ``take_spares`` (:func:`spares.spare_use`). A
        repair replaces what it can: the lost nodes with a place go there, and the
        record (epoch + 1) stays ``degraded``, saying why and asking the autoscaler, for
        those without; a move is all or nothing."""
        await self._nodes.refresh()
        table = await self._io.groups(sorted(res.group_ids()))
        found = groups.broken_slots(res, table, self._nodes, self._nodes.suspected())
        moving = {i for i, s in enumerate(res.slots) if s.node_id in (draining or {})}
        broken = sorted(set(found) | moving)
        if not broken:
            if draining is None:
                await self._records.ready(res)
            return None, "", set(), None
        await self._reclaim_wandered(res, table, found)
        live = self._nodes.view(res.spec.accelerator)
        live_by_id = {n.node_id: n for n in live.nodes}
        placed = {g for g, info in table.items() if info.state == CREATED}
        # A node silent to the watch, not judged yet, is no place to move to: a held
        # spare there is skipped, as is a free one (the ranks would be lost again).
        silent = self._nodes.silent()
        heard = [n for n in live.nodes if n.node_id not in silent]
        usable = spares.usable_spares(
            res, {n.node_id: n for n in heard}, self._nodes.draining, placed
        )
        adopted: dict[int, list[int]] = {}  # held spare -> the slots it becomes
        who = f"{'move' if draining is not None else 'repair'}/{res.job}"
        free = self._claims.free(await self._io.free_resources(), but=who)
        taken = {s.node_id for i, s in enumerate(res.slots) if i not in broken}
        # Where each goes is its cause's (controller.state.causes.RESPONSES). A lost
        # node's slots (several after an apply grew it) move together, as one slot on
        # one spare.
        parts: list[tuple[Any, list[int]]] = []
        lost: dict[int, list[int]] = {}
        for i in broken:
            slot = res.slots[i]
            cause = found[i].cause if i in found else DRAIN
            if RESPONSES[cause].replace_on == OWN_NODE and slot.node_id in live_by_id:
                parts.append((live_by_id[slot.node_id], [i]))
            else:
                lost.setdefault(slot.node_rank, []).append(i)
        plan = (await self._state.plan(res.job)).plan if lost else None
        why, short = "", []  # the first reason, and every lost node without a spare
        for node_rank, idxs in sorted(lost.items()):
            keep = spares.segments_kept(res.spec, plan, node_rank, res.nodes[node_rank])
            bundles = [b for i in idxs for b in res.slots[i].bundles]
            sel = spares.selectors_for(res, node_rank)
            dead = res.nodes[node_rank]
            use = spares.spare_use(res, plan, node_rank)
            need = spares.need_of(bundles)
            held, spare = None, None
            # A spare copying a node like this one runs standbys of its ranks: taken first
            # (its standbys are promoted), whatever spare_use says of the others.
            like = spares.spares_like(res, plan, node_rank)
            if like:
                held = spares.held_for(res, dead, bundles, usable, taken, sel, keep, like)
            if held is None and use == spares.FIRST:
                held = spares.held_for(res, dead, bundles, usable, taken, sel, keep)
            if held is None:
                spare = spares.choose_spare(
                    res.nodes[node_rank], heard, free, need, taken, sel, keep,
                    self._claims.busy(but=who),
                )  # fmt: skip
            if held is None and spare is None and use == spares.LAST:  # the spare after all
                held = spares.held_for(res, dead, bundles, usable, taken, sel, keep)
            if held is not None:
                taken.add(res.spares[held].node_id)
                adopted[held] = idxs
                continue
            if spare is None:
                first = res.slots[idxs[0]]
                wants = ", ".join(f"{k} {v:g}" for k, v in sorted(need.items()))
                where = "".join(f" {k.describe()}" for k in keep)
                lost_how = "is on draining node" if idxs[0] in moving else "lost node"
                why = why or (
                    f"slot {idxs[0]} (node rank {node_rank}) {lost_how} {first.node_ip} "
                    f"({first.node_id[:12]}); no spare node of the same kind with {wants} "
                    f"free{where}; waiting for one to join"
                    + (
                        " (its ranks run short; the held spares are left to the standbys:"
                        " take_spares: true would take one)"
                        if use == spares.NEVER and usable
                        else ""
                    )
                )
                short.append((res.nodes[node_rank], [res.slots[i] for i in idxs]))
                continue
            taken.add(spare.node_id)
            self._claims.claim(who, spare.node_id, need)  # before any await: no other takes it
            parts.append((spare, idxs))
        want, left = None, ""
        if short:
            alive = self._nodes.alive_view(res.spec.accelerator)  # no demand lands on any
            wants = [for_spare(slots, node, alive, res.spec.accelerator) for node, slots in short]
            want = Want(groups=[g for w in wants for g in w.groups], why=wants[0].why)
            left = f"{why}; asked the autoscaler for {want.describe()}"
            if draining is not None or not (parts or adopted):
                return None, left, set(), want
            # A repair takes what it can and leaves the rest degraded, never all or nothing:
            # a node with a spare is replaced now, the one without waits for a node.
        self._incarnation.crash_point("replace_after_plan")
        token = secrets.token_hex(3)
        fresh = [
            msgspec.structs.replace(
                res.slots[idxs[0]],
                node_id=target.node_id,
                node_ip=target.ip,
                group_name=f"{self._prefix}{res.job}:{token}:{k}",
                group_id="",
                bundles=[
                    msgspec.structs.replace(b, physical_id=-1, uuid="", pci_bus_id="")
                    for i in idxs
                    for b in res.slots[i].bundles
                ],
            )
            for k, (target, idxs) in enumerate(parts)
        ]
        took = [  # held spares made slots: placed and probed already
            msgspec.structs.replace(
                res.spares[j], node_rank=res.slots[idxs[0]].node_rank, copies=-1
            )
            for j, idxs in adopted.items()
        ]
        await self._demand.withdraw(f"spare/{res.job}")  # it must not take the spares
        created: dict[int, str] = {}
        deadline = core.now() + self.settings.repair_timeout
        self._making[res.job] = {s.group_name for s in fresh}  # until done(job)
        try:
            fresh = await groups.create_and_wait(
                self._io,
                res.job,
                fresh,
                deadline,
                lambda m: None,
                created,
                self.settings.max_in_flight,
            )
            self._incarnation.crash_point("replace_after_create")
            fresh = await groups.probe(self._io, res.job, fresh, res.spec.accelerator, deadline)
            self._incarnation.crash_point("replace_after_probe")
            nodes = dict(res.nodes)
            moved = set()
            parts += [(usable[res.spares[j].node_id], idxs) for j, idxs in adopted.items()]
            for target, idxs in parts:
                old = res.slots[idxs[0]]
                nodes[old.node_rank] = target
                if old.node_id != target.node_id:
                    moved.add(old.node_id)
            gone = {i for _, idxs in parts for i in idxs}
            slots = sorted(
                [s for i, s in enumerate(res.slots) if i not in gone] + fresh + took,
                key=lambda s: s.node_rank,
            )
            masters = sorted(
                {x.component for x in res.leases if x.purpose == "master" and x.node_id in moved}
            )
            new = msgspec.structs.replace(
                res,
                nodes=nodes,
                slots=slots,
                leases=[x for x in res.leases if x.node_id not in moved],
                cores=[x for x in res.cores if x.node_id not in moved],
                spares=[s for j, s in enumerate(res.spares) if j not in adopted],
                epoch=res.epoch + 1,
                state=DEGRADED if left else READY,
                reason=left,
            )
            plan = (await self._state.plan(res.job)).plan
            new = standbys.settle_standby_leases(new, plan)  # a promoted standby's: its rank's
            new = await self._leaser.lease_masters(new, plan, holds, masters)
        except BaseException as e:
            if self._incarnation.dead:
                raise
            await groups.remove_verified(
                self._io, set(created.values()), self.settings.removal_timeout
            )
            if isinstance(e, Exception):
                return None, f"replacing slots {broken} failed, will retry: {e}", set(), None
            raise
        replaced = sorted(i for _, idxs in parts for i in idxs)
        log.warning("reservation %r: replaced slots %s (epoch %d)", res.job, replaced, new.epoch)
        if left:
            log.warning("reservation %r stays degraded: %s", res.job, left)
        return new, "", {res.slots[i].group_id for i in replaced} - {""}, want
