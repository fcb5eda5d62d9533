#!/usr/bin/env python3
"""How long until a node that failed without a word is dead in Ray's node table: Ray's
own health checks alone, against placectl's raylet checks and fence, side by side.

One local cluster per setting of Ray's health checks (its defaults, and the tighter ones
docs/operations/failures.md recommends), a head, two nodes that hold nothing, and GPU
nodes of 2 fake GPUs. Each trial
fails one node as machines fail (every process killed, every process stopped, or the
raylet alone killed)
and polls Ray's node table until the node is dead: once for a node that holds no
reservation (only Ray's checks can notice it), once for a node that holds a placectl
slot (placectl's checks run too). Trials alternate which goes first.

Usage: scripts/bench/bench_detection.py [--trials 2] [--kinds crash,hang,raylet]
"""

from __future__ import annotations

import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import ray
from harness import Results, local_cluster, parser

import clients
from clients.testing import machines

SETTINGS = {"Ray's defaults": {}, "tighter": machines.TIGHT_HEALTH_CHECKS}
KINDS = ("crash", "hang", "raylet")


def fail(cluster, node, kind: str):
    if kind == "crash":
        machines.crash(cluster, node)
    elif kind == "raylet":
        machines.kill_raylet(node)
    else:
        return machines.hang(node)
    return None


def until_dead(node_id: str, limit: float = 120.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if any(n["NodeID"] == node_id and not n["Alive"] for n in ray.nodes()):
            return time.monotonic() - started
        time.sleep(0.05)
    return float("nan")


def trial(cluster, ctl, kind: str, reserved: bool) -> float:
    node = cluster.add_node(num_cpus=2, num_gpus=2)
    cluster.wait_for_nodes()
    job = None
    if reserved:
        job = "detect"
        # head, the two bystanders and it: its GPUs are the only ones
        pin = {"num_nodes": 4, "component_placement": {"actor": "0-1"}}
        res = ctl.reserve(job, pin, timeout_s=60)
        node = next(n for n in cluster.list_all_nodes() if n.node_id == res.info.slots[0].node_id)
    stopped = fail(cluster, node, kind)
    took = until_dead(node.node_id)
    if stopped is not None:
        machines.resume(node, stopped)
    if job:
        ctl.release(job, force=True)
    if node in cluster.list_all_nodes():
        cluster.remove_node(node, allow_graceful=False)
    return took


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--kinds", default=",".join(KINDS))
    args = ap.parse_args()
    results = Results("detection", args)
    kinds = [k for k in args.kinds.split(",") if k]
    rows = []
    for label, system in SETTINGS.items():
        head = {"num_cpus": 2, "num_gpus": 0, "_system_config": system}
        # Two nodes that hold nothing stand by: placectl fences a silent node only when
        # it reaches a majority of the nodes it asks and witnesses agree (two nodes, a
        # head and the failed one, cannot outvote each other).
        bystanders = [{"num_cpus": 1, "num_gpus": 0}] * 2
        with local_cluster(0, head=head, nodes=bystanders, log_level="ERROR") as (cluster, _):
            ctl = clients.connect()
            for kind in kinds:
                seconds: dict[bool, list[float]] = {False: [], True: []}
                for t in range(args.trials):
                    for reserved in (False, True) if t % 2 == 0 else (True, False):
                        seconds[reserved].append(trial(cluster, ctl, kind, reserved))
                rows.append((label, kind, seconds[False], seconds[True]))
                alone = results.add(f"Ray alone, {label}, {kind}", seconds[False])
                results.add(
                    f"with placectl, {label}, {kind}", seconds[True], baseline=alone["name"]
                )
                print(f"  {label}, {kind}: Ray {seconds[False]}, placectl {seconds[True]}")
    print(f"\n== seconds from the fault until Ray's node table says dead (median of {args.trials})")
    print(f"{'Ray health checks':<16} {'fault':<8} {'Ray alone':>10} {'with placectl':>14}")
    for label, kind, ray_s, ours in rows:
        a, b = statistics.median(ray_s), statistics.median(ours)
        print(f"{label:<16} {kind:<8} {a:>10.2f} {b:>14.2f}")
    results.write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
