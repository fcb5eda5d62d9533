"""The invariants scripts/chaos/chaos.py checks after every step, with the memory they need
from one check to the next. They read only the table (as drivers do) and Ray's own
tables: no check calls the controller.

Invariants, checked once the table has settled after each step:
  * no double-booking: no (node, physical accelerator) is held by two reservations;
  * no port leased twice on a node, and concurrent calls with one name get one lease;
  * no leak: the placement groups named by this controller are exactly those the
    reservation table references;
  * table = groups: every ready reservation's groups are CREATED, on alive nodes;
  * stable assignments: a reservation's assignments change only when its epoch does;
  * an apply keeps the ranks it says stay in the same group, on the same devices;
  * nothing that is not preemptible is preempted, and no placed reservation vanishes
    without a release of it;
  * the queue's quota is never exceeded by its placed reservations;
  * no node back from the dead: a hung node resumed after Ray gave it up stays dead
    and no ready reservation holds a slot on it;
  * a worker group's repair() relaunches exactly its dead ranks, no live one;
  * no admission out of order: a reservation of queue "order" placed since the last
    check never took a node that one queued before it and still waiting (of higher
    priority, or of the same and queued earlier, and plannable on the live nodes) needs.
(A node back from the dead and a worker group's repair are checked in chaos_machines.py.)
"""

from __future__ import annotations

from collections import Counter

import ray
from ray.util.placement_group import placement_group_table

from controller import ComponentPlacement, PlacementError
from controller.runtime.core.nodes import live_view
from controller.runtime.edge.ray_io import node_infos


class Invariants:
    """Args:
    ctl: the chaos driver's controller client (its table reads only).
    prefix: the group-name prefix of the controller's groups.
    quota: the GPUs queue "chaos" may hold.
    """

    def __init__(self, ctl, prefix: str, quota: float) -> None:
        self.ctl = ctl
        self.prefix = prefix
        self.quota = quota
        self.seen: dict[str, tuple[float, int, dict]] = {}
        self.replaced = 0  # slot replacements seen (epoch increases)
        self.placed: dict[str, bool] = {}  # placed at the last check: preemptible?
        self.preempted: set[tuple[str, str]] = set()
        self.queued_before: set[str] = set()

    def forget_assignments(self) -> None:
        """The table was rewritten (a migrated record gets a uid of its own)."""
        self.seen.clear()

    def snapshot(self, table):
        """The table, the live groups read with it, and whether they have settled: no
        call in flight, the groups match the table, and the controller has seen every
        node death (a ready reservation has all its groups placed). The checks use this
        very snapshot, so a repair that starts after it (a raylet may also die on its
        own) cannot be mistaken for a leak."""
        if table is None:
            return False, None, set()
        live = self.live_groups()
        ok = (
            not any(r.state in ("pending", "releasing") or r.applying for r in table.values())
            and live == {s.group_id for r in table.values() for s in r.slots}
            and not unplaced_but_ready(table)
        )
        return ok, table, live

    def live_groups(self) -> set[str]:
        return {
            gid
            for gid, info in placement_group_table().items()
            if info["state"] != "REMOVED" and (info.get("name") or "").startswith(self.prefix)
        }

    def check(self, table, live: set[str], touched: set[str]) -> list[str]:
        """Every violation in one snapshot (``touched``: jobs this step released or
        replaced)."""
        bad = unplaced_but_ready(table)
        held = Counter(
            (s.node_id, b.physical_id)
            for r in table.values()
            for s in r.slots
            for b in s.bundles
            if b.kind == "accelerator"
        )
        bad += [f"double-booked {k}" for k, n in held.items() if n > 1]
        ports = Counter((x.node_id, p) for r in table.values() for x in r.leases for p in x.ports)
        bad += [f"port leased twice {k}" for k, n in ports.items() if n > 1]
        referenced = {s.group_id for r in table.values() for s in r.slots}
        if live != referenced:
            bad.append(
                f"groups {sorted(live - referenced)} leaked, {sorted(referenced - live)} missing"
            )
        for r in table.values():
            if r.state == "ready":
                res = self.ctl.reservation(r.job)
                now = {c: res.assignments(c, allow_degraded=True) for c in res.components}
                prev = self.seen.get(r.job)
                if prev and prev[0] == r.created_at and prev[1] == r.epoch and prev[2] != now:
                    bad.append(f"{r.job}: assignments changed within epoch {r.epoch}")
                if prev and prev[0] == r.created_at and r.epoch > prev[1]:
                    self.replaced += r.epoch - prev[1]
                self.seen[r.job] = (r.created_at, r.epoch, now)
        return bad + self.queue_violations(table, touched)

    def queue_violations(self, table, touched: set[str]) -> list[str]:
        """Nothing preempted that was not preemptible; no placed reservation gone without
        a release of it (or its preemption); the queue's quota kept."""
        bad = [
            f"{r.job} is being preempted but is not preemptible"
            for r in table.values()
            if r.preempt_at and not r.preemptible
        ]
        for r in table.values():
            if r.preempt_at:
                self.preempted.add((r.job, r.uid))
        now = {j: r.preemptible for j, r in table.items() if r.state in ("ready", "degraded")}
        for job, spot in self.placed.items():
            if job not in table and job not in touched and not spot:
                bad.append(f"{job} vanished although nobody released it")
        self.placed = now
        held = sum(
            b.resources.get("GPU", 0.0)
            for r in table.values()
            if r.queue == "chaos" and r.state != "queued"
            for s in r.slots
            for b in s.bundles
        )
        if held > self.quota + 1e-9:
            bad.append(f'queue "chaos" holds {held:g} GPUs, over its quota of {self.quota:g}')
        bad += self.order_violations(table)
        return bad

    def order_violations(self, table) -> list[str]:
        """A reservation of queue "order" placed since the last check against one queued
        before it, still waiting, that needs one of its nodes (see the docstring)."""
        queued = {j: r for j, r in table.items() if r.state == "queued" and r.queue == "order"}
        before, self.queued_before = self.queued_before, set(queued)
        placed = [
            r
            for j, r in table.items()
            if j in before and r.queue == "order" and r.state != "queued" and r.slots
        ]
        if not placed:
            return []
        view = live_view(node_infos(), "GPU")
        bad = []
        for x in placed:
            taken = {s.node_id for s in x.slots}
            for y in queued.values():
                first = (-y.priority, y.queued_at) < (-x.priority, x.queued_at)
                if y.job not in before or not first:
                    continue
                try:
                    plan = ComponentPlacement(y.spec, view)
                except PlacementError:
                    continue  # not plannable now: it holds no node
                needs = {
                    view.nodes[p.node_rank].node_id
                    for c in plan.components
                    for p in plan.placements(c)
                }
                if needs & taken:
                    bad.append(f"{x.job} was placed on a node {y.job} waits for, before it")
        return bad


def unplaced_but_ready(table) -> list[str]:
    """Ready reservations whose groups Ray does not report placed on alive nodes."""
    groups = placement_group_table()
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    out = []
    for r in table.values():
        if r.state != "ready":
            continue
        for s in r.slots:
            info = groups.get(s.group_id)
            if info is None or info["state"] != "CREATED" or s.node_id not in alive:
                out.append(f"{r.job} is ready but its group {s.group_id} is not placed")
    return out
