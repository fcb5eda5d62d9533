#!/usr/bin/env python3
"""Head restart: how long from the head's return until placectl answers and repairs.

A local cluster with Ray's GCS fault tolerance (a Redis server this script starts; a head
without GPUs and three raylets with 4 fake GPUs) holds one colocated reservation on two
nodes, with its workers running. Each trial takes the head down, removes one of the
reservation's nodes while it is down (the worst case: a loss nobody saw happen), and
brings the head back. Two faults:

* ``gcs``: the GCS process alone restarts (the controller lives on);
* ``head``: every process of the head dies, the controller with it, and a new head node
  starts against the same store (the controller is restarted there by Ray).

Timed from the start of the new GCS, by a driver that connects as soon as it can:

* ``ray``: Ray's own recovery, the new GCS answering a key-value read;
* ``dead``: Ray reporting the lost node dead (the GCS waits for raylets to come back
  before it declares one gone);
* ``controller``: the controller answering, recovered, following node events again;
* ``repaired``: the reservation ready again at a later epoch, with the same uid.

It also checks, at every trial, that the surviving node's groups are the same groups in
state CREATED and the workers there the same processes.

Usage: scripts/bench/bench_head.py [--trials 3]
"""

from __future__ import annotations

import pathlib
import statistics
import sys
import threading
import time

import ray
from harness import Results, parser
from ray.util.placement_group import placement_group_table

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import clients
from clients.testing.head import FaultTolerantCluster, restartable_cluster

GPUS = 4
SPEC = {"num_nodes": 3, "component_placement": {"actor,rollout": "0-7"}}


class Worker:
    def who(self):
        return ray.get_runtime_context().get_actor_id()


def watch(predicates: dict, started: float, timeout: float = 180.0) -> dict[str, float]:
    """Seconds since ``started`` at which each predicate first held; each is asked in a
    thread of its own, so one that blocks (a call to an actor Ray is restarting) delays
    no other."""
    out: dict[str, float] = {}

    def follow(name, predicate):
        while time.monotonic() - started < timeout:
            try:
                if predicate():
                    out[name] = time.monotonic() - started
                    return
            except Exception:
                pass  # the cluster is coming back: keep asking
            time.sleep(0.02)

    threads = [threading.Thread(target=follow, args=item) for item in predicates.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    missing = sorted(set(predicates) - set(out))
    if missing:
        raise SystemExit(f"not within {timeout:.0f}s: {missing}")
    return out


def trial(c: FaultTolerantCluster, fault: str) -> dict[str, float]:
    ctl = clients.connect(start=False)
    res = ctl.reservation("bench")
    group = clients.WorkerGroup.attach(res, "actor", Worker)
    before = res.info
    lost = before.slots[0].node_id
    survivor = {s.group_id for s in before.slots if s.node_id != lost}
    kept_ranks = [r for r, a in enumerate(res.assignments("actor")) if a.placement.node_id != lost]
    kept_ids = [group.execute_rank(r, "who") for r in kept_ranks]
    incarnation = ctl.check_alive()
    victim = next(n for n in c.worker_nodes if n.node_id == lost)

    if fault == "head":
        ray.shutdown()
        c.stop_head()
        c.remove_node(victim)
        started = time.monotonic()
        c.add_node(**c.head_args)  # returns once the new head's raylet registered
        c.connect()
    else:
        c.head_node.kill_gcs_server()
        c.remove_node(victim)
        started = time.monotonic()
        c.head_node.start_gcs_server()

    reader = clients.Controller()  # reads the table in the GCS, as drivers do

    def gcs_answers():
        return reader.record("bench") is not None

    def node_dead():
        return bool(reader.dead_nodes([lost]))

    def controller_answers():
        h = clients.connect(start=False).health()
        fresh = fault == "gcs" or h["incarnation"] != incarnation
        return fresh and h["recovered"] and h["node_events"] == "subscribed"

    def repaired():
        rec = reader.record("bench")
        return rec.state == "ready" and rec.epoch > before.epoch and rec.uid == before.uid

    out = watch(
        {
            "ray": gcs_answers,
            "dead": node_dead,
            "controller": controller_answers,
            "repaired": repaired,
        },
        started,
    )
    table = placement_group_table()
    if any(table[g]["state"] != "CREATED" for g in survivor):
        raise SystemExit(f"a surviving group is not CREATED after the {fault} restart")
    res = clients.connect(start=False).reservation("bench")
    group = clients.WorkerGroup.attach(res, "actor", Worker)
    if [group.execute_rank(r, "who") for r in kept_ranks] != kept_ids:
        raise SystemExit(f"a surviving worker changed across the {fault} restart")
    group.repair(timeout=120)
    c.add_node(num_cpus=GPUS, num_gpus=GPUS)  # the next spare
    c.wait_for_nodes(timeout=120)
    return out


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()
    with restartable_cluster(gpu_nodes=3, gpus=GPUS) as c:
        ctl = clients.connect()
        res = ctl.reserve("bench", SPEC, timeout_s=120)
        clients.WorkerGroup.launch(res, "actor", Worker, detached=True)
        measured = Results("head", args)
        results: dict[str, list[dict[str, float]]] = {"gcs": [], "head": []}
        for i in range(args.trials):
            for fault in ("gcs", "head"):
                got = trial(c, fault)
                results[fault].append(got)
                print(
                    f"trial {i + 1} {fault}: " + ", ".join(f"{k} {v:.2f}s" for k, v in got.items())
                )
        print(f"\n{args.trials} trials; seconds from the start of the new GCS (median, max)")
        print("| fault | Ray: GCS answers | Ray: lost node dead | controller answers | repaired |")
        print("|---|---|---|---|---|")
        for fault, rows in results.items():
            cells = []
            for key in ("ray", "dead", "controller", "repaired"):
                xs = [r[key] for r in rows]
                measured.add(f"{fault} {key}", xs)
                cells.append(f"{statistics.median(xs):.2f} ({max(xs):.2f})")
            name = "GCS process restarts" if fault == "gcs" else "whole head restarts"
            print(f"| {name} | " + " | ".join(cells) + " |")
        clients.connect(start=False).release_all()
    measured.write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
