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

Invariants, checked once the table has settled after each step: scripts/chaos/chaos_invariants.py.

Usage: scripts/chaos/chaos.py [--steps 200] [--seed 1]
Prints every operation, the faults injected, the violations found; exits 1 on any.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import subprocess
import sys
import threading
import time
from collections import Counter

import ray

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from chaos_invariants import Invariants
from chaos_machines import MachineFaults, wait_until

import clients
from clients.testing.head import FaultTolerantCluster, RedisServer
from clients.testing.legacy import rewrite_as_v1, v1_table
from controller import PlacementError, load_spec
from controller.errors import TableUnreadable
from controller.runtime.core.nodes import live_view
from controller.runtime.edge.ray_io import node_infos
from controller.state.table import QUOTA as QUOTA_KEY
from controller.state.table import migrate_v1

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
        self.ops: Counter = Counter()
        self.faults: Counter = Counter()
        self.violations: list[str] = []
        self.ctl.set_quota("chaos", force=True, GPU=QUOTA)
        self.waiting: dict[str, subprocess.Popen] = {}
        self.touched: set[str] = set()  # jobs this step released or replaced
        self.invariants = Invariants(self.ctl, self.prefix, QUOTA)
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
            self.machines.kill_controller()
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
            self.machines.kill_controller()
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
            cwd=pathlib.Path(__file__).resolve().parents[2],
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

        if not wait_until(gone, 120):
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
        rewrite_as_v1("placectl", data, keep=(QUOTA_KEY,))  # the quota stays, as if set later
        # a migrated record gets a uid of its own: compare assignments from here on
        self.invariants.forget_assignments()
        return True

    # ------------------------------------------------------------ invariants
    def table(self):
        try:
            return self.ctl.table()
        except PlacementError:  # format 1 until the restarted controller migrates it
            return None

    def check(self, i: int) -> None:
        """Let replacements that can happen, happen (a degraded one may wait for a node),
        then check every invariant on one snapshot of the table and the live groups."""
        deadline = time.monotonic() + 60
        while True:
            ok, table, live = self.invariants.snapshot(self.table())
            if ok or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if table is None:
            self.violations.append(f"step {i}: the table was never migrated")
            return
        bad = self.invariants.check(table, live, self.touched)
        bad += self.machines.violations_now(table)
        self.ops["preempted"] = len(self.invariants.preempted)
        for b in bad:
            self.violations.append(f"step {i}: {b}")
            print(f"      VIOLATION {b}", flush=True)

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
            f"replacements {chaos.invariants.replaced}; violations {len(chaos.violations)}"
        )
        chaos.close()
        print(summary)
        for v in chaos.violations:
            print("  " + v)
    return 1 if chaos.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
