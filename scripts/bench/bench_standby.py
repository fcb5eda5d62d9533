#!/usr/bin/env python3
"""Warm standby against relaunch: from a node's abrupt death to a worker group that
answers again, side by side in one run.

A local cluster (a head and raylets of 4 fake GPUs each) runs one job of 4 ranks on one
node; each rank's constructor takes ``--load`` seconds (a model load, stood in for). Each
trial removes the job's node abruptly (``allow_graceful=False``) and, at once, calls
``repair()`` and then one method on every rank; it times until every rank has answered.
Two modes, alternating trial by trial:

* ``standby``: ``cluster.spares: 1`` and ``standby: true``: the reservation holds a spare
  node and the group keeps standbys there; the repair promotes them;
* ``relaunch``: the same job without either: the repair places the lost slot on a free
  node and starts the ranks there, as placectl did before standbys.

Also reported: the GPUs each mode holds (the cost of a standby is its held node).
A new node joins after each trial, so every trial finds a free node.

Usage: scripts/bench/bench_standby.py [--trials 3] [--load 10]
"""

from __future__ import annotations

import os
import time

import ray
from harness import Results, local_cluster, parser

import clients

GPUS = 4


class Rank:
    def __init__(self, load_s: float) -> None:
        time.sleep(load_s)

    def pid(self) -> int:
        return os.getpid()


def spec(standby: bool) -> dict:
    comp = {"placement": f"0-{GPUS - 1}", "standby": standby}
    return {"num_nodes": 2, "spares": int(standby), "component_placement": {"actor": comp}}


def held(res, n: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while len(res.refresh().spares) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"no spare held after {timeout:g} s: {res.refresh().reason}")
        time.sleep(0.1)


def trial(cluster, ctl, standby: bool, load: float) -> tuple[float, int, bool]:
    """Seconds from the death to every rank answering, GPUs held before the death, and
    whether the ranks that answer are processes that ran before it."""
    job = "standby" if standby else "relaunch"
    res = ctl.reserve(job, spec(standby), timeout_s=120)
    try:
        group = clients.WorkerGroup.launch(res, "actor", Rank, load, detached=True)
        if standby:
            held(res, 1)
            while len(group.standbys) < GPUS:
                group.refill_standbys()
                time.sleep(0.1)
            ray.get([a.__ray_ready__.remote() for a in group.standbys])
        info = res.refresh()
        gpus = info.num_accelerators + sum(len(s.accelerators) for s in info.spares)
        before = set(ray.get([a.pid.remote() for a in group.standbys]))
        victim = next(n for n in cluster.list_all_nodes() if n.node_id == info.slots[0].node_id)
        started = time.perf_counter()
        cluster.remove_node(victim, allow_graceful=False)
        group.repair(timeout=300)
        pids = set(ray.get([a.pid.remote() for a in group.actors]))
        took = time.perf_counter() - started
        group.shutdown()
        return took, gpus, pids <= before and bool(pids)
    finally:
        ctl.release(job)
        cluster.add_node(num_cpus=GPUS, num_gpus=GPUS)  # every trial finds a free node
        cluster.wait_for_nodes()


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--load", type=float, default=10.0, help="a rank's start, seconds")
    args = ap.parse_args()
    results = Results("standby", args)
    samples: dict[str, list[float]] = {"standby": [], "relaunch": []}
    held_gpus: dict[str, int] = {}
    with local_cluster(3, gpus=GPUS, log_level="ERROR") as (cluster, _):
        ctl = clients.connect()
        try:
            for _ in range(args.trials):
                for mode in ("standby", "relaunch"):
                    took, gpus, warm = trial(cluster, ctl, mode == "standby", args.load)
                    if warm != (mode == "standby"):
                        raise SystemExit(f"{mode}: the ranks after the repair were warm={warm}")
                    samples[mode].append(took)
                    held_gpus[mode] = gpus
        finally:
            ctl.release_all()
    for mode, values in samples.items():
        m = results.add(mode, values)
        print(
            f"{mode:<9} p50 {m['median']:.2f} s  max {m['max']:.2f} s  GPUs held "
            f"{held_gpus[mode]}  samples {' '.join(f'{s:.2f}' for s in values)}",
            flush=True,
        )
    results.write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
