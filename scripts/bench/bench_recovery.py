#!/usr/bin/env python3
"""Recovery time: from a node's death to the reservation being ready at the next epoch.

A local cluster (a head and three raylets with 4 fake GPUs each) holds one reservation on
one node; each trial removes that node and times, by reading only the reservation's
record in the GCS (as a driver's ``wait_ready`` does), until it is ready again at a
higher epoch on the spare; a new node then joins as the next spare. Two modes:

* ``alive``: the controller is running when the node dies;
* ``restarting``: the controller is killed (Ray restarts it) just before the node dies,
  so the new incarnation must find the loss by itself, with no call to wake it.

Usage: scripts/bench/bench_recovery.py [--trials 20]
"""

from __future__ import annotations

import time

import ray
from harness import Results, local_cluster, parser

import clients

GPUS = 4


def trial(cluster, ctl, restart: bool) -> float:
    reader = clients.Controller(None)  # reads the GCS only
    before = reader.record("bench")
    victim = next(n for n in cluster.list_all_nodes() if n.node_id == before.slots[0].node_id)
    if restart:
        ray.kill(ctl.handle, no_restart=False)
    started = time.perf_counter()
    cluster.remove_node(victim)
    while True:
        rec = reader.record("bench")
        if rec.state == "ready" and rec.epoch > before.epoch:
            took = time.perf_counter() - started
            break
        if time.perf_counter() - started > 120:
            raise SystemExit(f"not recovered after 120 s: {rec.state} {rec.reason}")
        time.sleep(0.02)
    cluster.add_node(num_cpus=GPUS, num_gpus=GPUS)  # the next spare
    cluster.wait_for_nodes()
    return took


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--trials", type=int, default=20)
    args = ap.parse_args()
    results = Results("recovery", args)
    with local_cluster(3, gpus=GPUS, log_level="ERROR") as (cluster, _):
        ctl = clients.connect()
        ctl.reserve("bench", {"num_nodes": 2, "component_placement": {"actor": "0-3"}}, 120)
        try:
            for mode in ("alive", "restarting"):
                samples = [trial(cluster, ctl, mode == "restarting") for _ in range(args.trials)]
                m = results.add(mode, samples)
                print(
                    f"{mode:<11} p50 {m['median']:.2f} s  p99 {m['p99']:.2f} s  "
                    f"max {m['max']:.2f} s  samples {' '.join(f'{s:.2f}' for s in samples)}",
                    flush=True,
                )
        finally:
            ctl.release_all()
    results.write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
