#!/usr/bin/env python3
"""Seeded chaos on a local cluster: reserve, release, leases, controller kills, node loss
and node arrival, restarts over an old table, with placectl's invariants checked after
every step. The observers read only the table in the GCS, as drivers do: no check ever
calls the controller, so none can wake it up.

Operations: reserve (some preemptible), release, apply another configuration to a live
reservation, leases, queued reservations of random priority (q1, q2 in queue "order",
without a quota; q3 in queue "chaos", with a GPU quota; each waits in a thread of its own
and may preempt).
Faults: killing the controller (and, half the time, losing a node before any call
reaches the new one), killing it at a step of an apply, losing and adding nodes (two
losses in three abrupt: every process killed, Ray not told), hung nodes (every process
stopped, resumed once Ray reports the node dead), workers killed under a worker group,
restarting the head (the GCS process alone, or the whole head node with the controller
on it; half the time a node is removed while the head is down): the cluster runs Ray's
GCS fault tolerance on a Redis server this script starts,
rewriting the table as placectl 0.1 left it (format 1) and killing the controller,
concurrent leases under one name.

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

Usage: scripts/chaos.py [--steps 200] [--seed 1]
Prints every operation, the faults injected, the violations found; exits 1 on any.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import ray
from ray.experimental import internal_kv
from ray.util.placement_group import placement_group_table

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from chaos_machines import MachineFaults

import clients
from clients.testing.head import FaultTolerantCluster, RedisServer
from clients.testing.legacy import v1_table
from controller import ComponentPlacement, PlacementError, load_spec
from controller.errors import TableUnreadable
from controller.runtime.nodes import live_view
from controller.runtime.ray_io import node_infos
from controller.state.table import KV_NAMESPACE, LEGACY_KEY, kv_prefix, migrate_v1
from controller.state.table import QUOTA as QUOTA_KEY

GPUS = 4
JOBS = ["a", "b", "c", "d"]
QJOBS = ["q1", "q2", "q3"]  # q3 in queue "chaos" (quota), the others in "order"
QUOTA = 6.0  # GPUs queue "chaos" may hold
APPLY_STEPS = ["apply_after_intent", "apply_after_create", "apply_after_probe", "apply_after_write"]
SPECS = [
    {"num_nodes": 2, "component_placement": {"actor": "0-1"}},
    {"num_nodes": 2, "component_placement": {"actor,rollout": "2-3"}},
    {"num_nodes": 3, "component_placement": {"actor": "4-7:0-1"}},
    {"num_nodes": 3, "component_placement": {"actor": "6-7", "ref": "6-7:0"}},
    {
        "num_nodes": 4,
        "component_placement": {"actor": "8-9", "svc": {"node_group": "node", "placement": "0"}},
    },
]


class Chaos:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        self.redis = RedisServer()
        self.cluster = FaultTolerantCluster(self.redis, {"num_cpus": 2})
        for _ in range(3):
            self.cluster.add_node(num_cpus=GPUS, num_gpus=GPUS)
        self.cluster.wait_for_nodes()
        ray.init(address=self.cluster.address, logging_level="ERROR", log_to_driver=False)
        self.ctl = clients.connect()
        self.prefix = ray.get(self.ctl.handle.group_prefix.remote())
        self.seen: dict[str, tuple[float, int, dict]] = {}
        self.ops: Counter = Counter()
        self.faults: Counter = Counter()
        self.violations: list[str] = []
        self.replaced = 0  # slot replacements seen (epoch increases)
        self.ctl.set_quota("chaos", force=True, GPU=QUOTA)
        self.waiting: dict[str, subprocess.Popen] = {}
        self.touched: set[str] = set()  # jobs this step released or replaced
        self.placed: dict[str, bool] = {}  # placed at the last check: preemptible?
        self.preempted: set[tuple[str, str]] = set()
        self.queued_before: set[str] = set()
        self.machines = MachineFaults(
            self.cluster, self.ctl, self.rng, self.faults, self.violations
        )

    # ------------------------------------------------------------ operations
    def gpu_nodes(self):
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        return [n for n in self.cluster.worker_nodes if n.node_id in alive]

    def step(self, i: int) -> str:
        r = self.rng.random()
        job = self.rng.choice(JOBS)
        self.touched = set()
        if r < 0.10:
            table = self.table() or {}
            ready = sorted(j for j, x in table.items() if x.state == "ready" and not x.queue)
            return self.apply(self.rng.choice(ready)) if ready else "apply: nothing ready"
        if r < 0.30:
            spec = self.rng.choice(SPECS)
            replace = self.rng.random() < 0.3
            spot = self.rng.random() < 0.4
            self.ops["reserve"] += 1
            if replace:
                self.touched.add(job)
            try:
                self.ctl.reserve(
                    job,
                    spec,
                    timeout_s=4,
                    replace=replace,
                    progress=lambda m: None,
                    preemptible=spot,
                    preempt_grace_s=1,
                )
                return f"reserve {job} {spec['component_placement']} replace={replace}: ok"
            except PlacementError as e:
                return f"reserve {job}: {type(e).__name__}"
        if r < 0.42:
            return self.queued(self.rng.choice(QJOBS))
        if r < 0.58:
            job = self.rng.choice(JOBS + QJOBS)
            self.ops["release"] += 1
            self.touched.add(job)
            try:
                return f"release {job}: {self.ctl.release(job)}"
            except PlacementError as e:
                return f"release {job}: {type(e).__name__}"
        if r < 0.62:
            return self.named_leases(job)
        if r < 0.68:
            self.faults["controller kill"] += 1
            self.kill_controller()
            nodes = self.gpu_nodes()
            if self.rng.random() < 0.5 and len(nodes) > 2:
                self.faults["node removed while the controller restarts"] += 1
                victim = self.rng.choice(nodes)
                self.remove(victim)
                return f"FAULT kill controller, then remove node {victim.node_id[:8]}"
            return "FAULT kill controller"
        if r < 0.72:
            return self.restart_head(whole=self.rng.random() < 0.5)
        if r < 0.76:
            if not self.downgrade():
                return "format-1 restart: skipped (no 0.1 table can be rebuilt for this one)"
            self.faults["restart over a format-1 table"] += 1
            self.kill_controller()
            return "FAULT table rewritten as format 1, controller killed"
        if r < 0.86:
            nodes = self.gpu_nodes()
            if len(nodes) <= 2:
                return "lose node: skipped (2 left)"
            victim = self.rng.choice(nodes)
            if r < 0.82:
                return f"FAULT node {victim.node_id[:8]} {self.remove(victim)}"
            how = self.machines.hang(victim, self.wait_dead)
            return f"FAULT node {victim.node_id[:8]} hung: {how}"
        if r < 0.90:
            table = self.table() or {}
            ready = sorted(j for j, x in table.items() if x.state == "ready" and j in JOBS)
            return self.machines.workers(self.rng.choice(ready)) if ready else "workers: none"
        if len(self.gpu_nodes()) >= 4:
            return "add node: skipped (4 present)"
        self.faults["node added"] += 1
        node = self.cluster.add_node(num_cpus=GPUS, num_gpus=GPUS)
        self.cluster.wait_for_nodes()
        return f"add node {node.node_id[:8]}"

    def kill_controller(self) -> None:
        """Kill the controller (Ray restarts it). After a GCS restart Ray 2.60 may drop
        the kill ("Not sending KillLocalActorRequest because Actor has not been assigned
        a lease"): then its process is killed instead, as a crash would."""
        before = self._controller_pid()
        ray.kill(self.ctl.handle, no_restart=False)
        if self.wait(lambda: self._controller_pid() != before, 10):
            return
        self.faults["Ray dropped a kill: process killed"] += 1
        if before:
            os.kill(before, signal.SIGKILL)

    @staticmethod
    def _controller_pid() -> int:
        for a in ray._private.state.state.actor_table(None).values():
            if a.get("Name") == "placectl" and a.get("State") == "ALIVE":
                return int(a.get("Pid") or 0)
        return 0

    def queued(self, job: str) -> str:
        """Reserve ``job`` in its queue at a random priority, from a driver process of its
        own that waits (a whole-head restart may end it, as it ends any driver on the
        head; its queued record stays, and the controller places it)."""
        if job in self.waiting and self.waiting[job].poll() is None:
            return f"queue {job}: still waiting"
        spec = self.rng.choice(SPECS)
        priority = self.rng.randrange(1, 6)
        queue = "chaos" if job == "q3" else "order"
        self.ops["queued reserve"] += 1
        code = (
            "import json, sys, clients\n"
            "spec = json.loads(sys.argv[1])\n"
            f"clients.connect(address={self.cluster.address!r}).reserve({job!r}, spec, "
            f"timeout_s=30, queue={queue!r}, priority={priority}, progress=lambda m: None)\n"
        )
        self.waiting[job] = subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(spec)],
            cwd=pathlib.Path(__file__).resolve().parents[1],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return f"queue {job} {queue} priority {priority} {spec['component_placement']}"

    def apply(self, job: str) -> str:
        """Apply another configuration to a live reservation, a third of the time with
        the controller killed at a random step of it (Ray retries the call)."""
        self.ops["apply"] += 1
        crash = ""
        try:
            before = self.ctl.reservation(job)
            old = {c: before.assignments(c) for c in before.components}
            now = self.ctl.record(job).spec
        except PlacementError as e:
            return f"apply {job}: {type(e).__name__}"
        spec = self.rng.choice([s for s in SPECS if load_spec(s) != now])
        if self.rng.random() < 0.33:
            crash = self.rng.choice(APPLY_STEPS)
            self.faults["controller killed during apply"] += 1
            ray.get(self.ctl.handle.arm_fault.remote(crash))
        try:
            got = self.ctl.apply(job, spec, timeout_s=4, progress=lambda m: None)
        except PlacementError as e:
            if crash:
                ray.get(self.ctl.handle.arm_fault.remote(None))
            return f"apply {job} {spec['component_placement']}: {type(e).__name__}"
        if crash:
            ray.get(self.ctl.handle.arm_fault.remote(None))  # if the step was never reached
        after = self.ctl.reservation(job)
        for c in got.components:
            for r in c.stays:
                a, b = old[c.name][r], after.assignments(c.name)[r]
                if (a.placement_group_id, a.placement.cuda_visible_devices) != (
                    b.placement_group_id,
                    b.placement.cuda_visible_devices,
                ):
                    self.violations.append(f"{job}/{c.name}:{r} said to stay but moved")
        where = f" (killed at {crash})" if crash else ""
        return (
            f"apply {job} {spec['component_placement']}{where}: epoch {got.epoch}, slots "
            f"{got.slots_kept} kept {got.slots_created} made {got.slots_removed} removed"
        )

    def restart_head(self, whole: bool) -> str:
        """Restart the GCS alone, or the whole head node (this driver, which runs on the
        head, disconnects first and attaches again after), half the time removing a node
        while the head is down."""
        kind = "whole head" if whole else "GCS"
        self.faults[f"{kind} restart"] += 1
        nodes = self.gpu_nodes()
        victim = self.rng.choice(nodes) if self.rng.random() < 0.5 and len(nodes) > 2 else None
        if whole:
            ray.shutdown()
            self.cluster.stop_head()
        else:
            self.cluster.head_node.kill_gcs_server()
        if victim is not None:
            self.faults[f"node killed while the {kind} is down"] += 1
            self.cluster.remove_node(victim, allow_graceful=False)
        if whole:
            self.cluster.start_head()
            ray.init(address=self.cluster.address, logging_level="ERROR", log_to_driver=False)
            self.ctl = clients.connect(start=False)
            self.machines.ctl = self.ctl
        else:
            self.cluster.head_node.start_gcs_server()
        if victim is not None:
            self.wait_dead(victim.node_id)
            return f"FAULT {kind} restart, node {victim.node_id[:8]} removed while it was down"
        return f"FAULT {kind} restart"

    def wait_dead(self, node_id: str) -> None:
        def gone() -> bool:
            return not any(n["Alive"] for n in ray.nodes() if n["NodeID"] == node_id)

        if not self.wait(gone, 120):
            self.violations.append(f"Ray never reported node {node_id[:8]} dead")

    def remove(self, node) -> str:
        """Lose a node (abruptly two times in three) and wait until Ray itself reports
        it dead, so the settle check that follows cannot pass on a view from before."""
        return self.machines.remove(node, self.wait_dead)

    def named_leases(self, job: str) -> str:
        """Four concurrent calls under one name must get one lease."""
        ready = sorted(j for j, r in (self.table() or {}).items() if r.state == "ready")
        if not ready:
            return "leases: skipped (nothing ready)"
        job = self.rng.choice(ready)
        self.ops["concurrent named leases"] += 1
        name = f"n{self.rng.randrange(3)}"
        got: list = []

        def lease():
            try:
                got.append(tuple(self.ctl.reservation(job).lease_ports("actor", 0, 2, name=name)))
            except PlacementError as e:
                got.append(type(e).__name__)

        threads = [threading.Thread(target=lease) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ports = {g for g in got if isinstance(g, tuple)}
        if len(ports) > 1:
            self.violations.append(f"lease {job}/{name}: one name, {len(ports)} leases {ports}")
        return f"leases {job} name={name}: {sorted(set(map(str, got)))}"

    def downgrade(self) -> bool:
        """Rewrite the GCS as placectl 0.1 left it: one key, format 1. False (nothing
        written) where this script cannot rebuild such a table: 0.1 stored the cluster
        view each record was planned on, which is rebuilt here from the live cluster, and
        after a node loss or a new head that view may no longer plan the record."""
        records = self.ctl.table()
        if any(r.state == "queued" for r in records.values()):
            return False  # 0.1 had no queue
        data = v1_table(records, live_view(node_infos(), "GPU"))
        try:
            migrate_v1(data)
        except TableUnreadable:
            return False
        prefix = kv_prefix("placectl")
        for k in internal_kv._internal_kv_list(prefix, namespace=KV_NAMESPACE):
            if not k.startswith(prefix + QUOTA_KEY):  # the quota stays, as if set later
                internal_kv._internal_kv_del(k, namespace=KV_NAMESPACE)
        internal_kv._internal_kv_put(prefix + LEGACY_KEY, data, namespace=KV_NAMESPACE)
        # a migrated record gets a uid of its own: compare assignments from here on
        self.seen.clear()
        return True

    @staticmethod
    def wait(predicate, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.2)
        return False

    # ------------------------------------------------------------ invariants
    def table(self):
        try:
            return self.ctl.table()
        except PlacementError:  # format 1 until the restarted controller migrates it
            return None

    def snapshot(self):
        """The table and the live groups, read together, and whether they have settled:
        no call in flight, the groups match the table, and the controller has seen every
        node death (a ready reservation has all its groups placed). The checks use this
        very snapshot, so a repair that starts after it (a raylet may also die on its
        own) cannot be mistaken for a leak."""
        table = self.table()
        if table is None:
            return False, None, set()
        live = self._live_groups()
        ok = (
            not any(r.state in ("pending", "releasing") or r.applying for r in table.values())
            and live == {s.group_id for r in table.values() for s in r.slots}
            and not self._unplaced_but_ready(table)
        )
        return ok, table, live

    @staticmethod
    def _unplaced_but_ready(table) -> list[str]:
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

    def _live_groups(self) -> set[str]:
        return {
            gid
            for gid, info in placement_group_table().items()
            if info["state"] != "REMOVED" and (info.get("name") or "").startswith(self.prefix)
        }

    def check(self, i: int) -> None:
        # Let replacements that can happen, happen (a degraded one may wait for a node).
        deadline = time.monotonic() + 60
        while True:
            ok, table, live = self.snapshot()
            if ok or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if table is None:
            self.violations.append(f"step {i}: the table was never migrated")
            return
        bad = self._unplaced_but_ready(table)
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
        bad += self.queue_violations(table)
        bad += self.machines.violations_now(table)
        for b in bad:
            self.violations.append(f"step {i}: {b}")
            print(f"      VIOLATION {b}", flush=True)

    def queue_violations(self, table) -> list[str]:
        """Nothing preempted that was not preemptible; no placed reservation gone without
        a release of it (or its preemption); the queue's quota kept."""
        bad = [
            f"{r.job} is being preempted but is not preemptible"
            for r in table.values()
            if r.preempt_at and not r.preemptible
        ]
        for r in table.values():
            if r.preempt_at and (r.job, r.uid) not in self.preempted:
                self.preempted.add((r.job, r.uid))
                self.ops["preempted"] += 1
        now = {j: r.preemptible for j, r in table.items() if r.state in ("ready", "degraded")}
        for job, spot in self.placed.items():
            if job not in table and job not in self.touched and not spot:
                bad.append(f"{job} vanished although nobody released it")
        self.placed = now
        held = sum(
            b.resources.get("GPU", 0.0)
            for r in table.values()
            if r.queue == "chaos" and r.state != "queued"
            for s in r.slots
            for b in s.bundles
        )
        if held > QUOTA + 1e-9:
            bad.append(f'queue "chaos" holds {held:g} GPUs, over its quota of {QUOTA:g}')
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

    def close(self) -> None:
        for p in self.waiting.values():
            p.kill()
        try:
            self.ctl.release_all(force=True)
        finally:
            ray.shutdown()
            self.cluster.shutdown()
            self.redis.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    chaos = Chaos(args.seed)
    started = time.monotonic()
    try:
        for i in range(1, args.steps + 1):
            what = chaos.step(i)
            chaos.check(i)
            states = Counter(r.state for r in (chaos.table() or {}).values())
            print(f"{i:4d} {what}  | {dict(states)}", flush=True)
    finally:
        summary = (
            f"chaos seed {args.seed}: {args.steps} steps in {time.monotonic() - started:.0f} s; "
            f"operations {dict(chaos.ops)}; faults {dict(chaos.faults)}; "
            f"replacements {chaos.replaced}; violations {len(chaos.violations)}"
        )
        chaos.close()
        print(summary)
        for v in chaos.violations:
            print("  " + v)
    return 1 if chaos.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
