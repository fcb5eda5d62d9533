#!/usr/bin/env python3
"""Reserve-and-learn-topology time, attach time and lookup latency, side by side.

On a local cluster of 4 nodes x 8 fake GPUs (plus a head without GPUs), in one run:

1. placectl: reserve a colocated two-component layout (actor and rollout sharing all
   32 GPUs) and learn which physical GPU each rank got (one pinned group per node,
   probe tasks), against the probe-actor approach many frameworks use: one PACK
   placement group of 32 single-GPU bundles, one ``num_gpus=1`` probe actor per bundle,
   sort by IP then GPU id. Cold and warm: the baseline starts its 32 actors in new
   worker processes (cold, as it runs in the frameworks); placectl is timed as deployed
   (its loop keeps one idle worker per node, started off the clock, for the probes) and
   cold (a second controller with that warm-up off), in alternating order.
2. Attaching to the existing reservation from a new driver process (connect, look the
   reservation up, fetch every component's assignments), after ``ray.init``.
3. ``assignments()`` latency against a no-op actor call, both uncached round trips.

Usage: scripts/bench/bench_reserve.py [--repeat 3]
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import ray
from harness import Results, local_cluster, parser
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

import clients
from clients.session import connect
from controller.runtime.controller import PlacementController
from controller.runtime.core.settings import Settings
from controller.runtime.edge import HEAD_RESOURCE

NODES, GPUS = 4, 8
LAYOUT = {"num_nodes": NODES + 1, "component_placement": {"actor,rollout": "all"}}


@ray.remote(num_gpus=1)
class _Probe:
    def where(self):
        return ray.util.get_node_ip_address(), [int(g) for g in ray.get_gpu_ids()]


def probe_actor_baseline() -> float:
    t0 = time.perf_counter()
    pg = placement_group([{"GPU": 1, "CPU": 1}] * (NODES * GPUS), strategy="PACK")
    ray.get(pg.ready())
    actors = [
        _Probe.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)
        ).remote()
        for i in range(NODES * GPUS)
    ]
    seen = ray.get([a.where.remote() for a in actors])
    order = sorted(range(len(seen)), key=lambda i: (seen[i][0], seen[i][1]))
    elapsed = time.perf_counter() - t0
    assert len(order) == NODES * GPUS
    for a in actors:
        ray.kill(a)
    remove_placement_group(pg)
    return elapsed


def placectl_reserve(ctl, job: str) -> float:  # ctl: the controller to reserve through
    t0 = time.perf_counter()
    res = ctl.reserve(job, LAYOUT, timeout_s=120)
    assignments = {c: res.assignments(c) for c in res.components}
    elapsed = time.perf_counter() - t0
    assert sum(len(v) for v in assignments.values()) == 2 * NODES * GPUS
    steps = ray.get(ctl.handle.timings.remote())
    detail = ", ".join(f"{k} {v:.3f}" for k, v in steps.items())
    print(f"  placectl run: {elapsed:.3f} s ({detail})")
    return elapsed


def cold_controller():
    """A second controller that never warms a node: its probes start new workers."""
    ray.remote(PlacementController).options(
        name="placectl-cold",
        namespace="placectl",
        lifetime="detached",
        num_cpus=0,
        resources={HEAD_RESOURCE: 0.001},
        max_concurrency=1000,
    ).remote("placectl-cold", settings=Settings(warm_budget=0))
    deadline = time.monotonic() + 60
    while True:
        try:
            ctl = connect(name="placectl-cold", start=False)
            ctl.check_alive()
            return ctl
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def attach_from_new_driver(address: str) -> float:
    script = textwrap.dedent(
        f"""
        import json, time, ray, clients, clients.session
        ray.init(address={address!r}, logging_level="ERROR", log_to_driver=False)
        t0 = time.perf_counter()
        res = clients.connect(start=False).reservation("bench")
        n = sum(len(res.assignments(c)) for c in res.components)
        print(json.dumps({{"s": time.perf_counter() - t0, "n": n}}))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["s"]


def timed(fn, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    results = Results("reserve", args)
    with local_cluster(NODES, gpus=GPUS) as (cluster, _):
        ctl = clients.connect()
        ctl.release_all()
        cold_ctl = cold_controller()
        ours, cold, theirs = [], [], []
        for i in range(args.repeat):  # rotate, so no side always gets the warmer cluster
            for side in ["warm", "cold", "probe"][i % 3 :] + ["warm", "cold", "probe"][: i % 3]:
                if side == "warm":
                    ours.append(placectl_reserve(ctl, f"bench-{i}"))
                    ctl.release(f"bench-{i}")
                elif side == "cold":
                    cold.append(placectl_reserve(cold_ctl, f"bench-cold-{i}"))
                    cold_ctl.release(f"bench-cold-{i}")
                else:
                    theirs.append(probe_actor_baseline())
                time.sleep(0.5)
        ray.kill(cold_ctl.handle)  # its loop must not load what is measured next
        t = results.add("probe actors", theirs)
        o = results.add("placectl reserve", ours, baseline="probe actors")
        c = results.add("placectl reserve, cold", cold, baseline="probe actors")
        print(f"reserve + topology, {NODES}x{GPUS} GPUs, median of {args.repeat}:")
        print(f"  placectl as deployed (warm):            {o['median']:7.3f} s  {sorted(ours)}")
        print(f"  placectl cold (no warm-up):             {c['median']:7.3f} s  {sorted(cold)}")
        print(f"  probe actors, cold (PACK + 32 actors):  {t['median']:7.3f} s  {sorted(theirs)}")
        print(
            f"  ratio placectl / probe actors:          {o['ratio']:7.3f} (cold {c['ratio']:.3f})"
        )

        res = ctl.reserve("bench", LAYOUT, timeout_s=120)
        attach = [attach_from_new_driver(cluster.address) for _ in range(args.repeat)]
        m = results.add("attach from a new driver", attach)
        print(f"attach from a new driver (connect + lookup + {2 * NODES * GPUS} assignments):")
        samples = [round(1000 * a, 1) for a in sorted(attach)]
        print(f"  median {1000 * m['median']:.1f} ms  {samples}")

        handle = ctl.handle
        ray.get(handle.assignments.remote("bench", "actor"))
        n = results.add("no-op call", timed(lambda: ray.get(handle.check_alive.remote()), 300))
        a = results.add(
            "assignments call",
            timed(lambda: ray.get(handle.assignments.remote("bench", "actor")), 300),
            baseline="no-op call",
        )
        print(
            f"round trip, 300 calls: assignments('actor', {len(res.assignments('actor'))} ranks) "
            f"p50 {1000 * a['median']:.2f} ms p99 {1000 * a['p99']:.2f} ms; no-op p50 "
            f"{1000 * n['median']:.2f} ms p99 {1000 * n['p99']:.2f} ms; "
            f"p99 ratio {a['p99'] / n['p99']:.2f}"
        )
        ctl.release_all()
    results.write()


if __name__ == "__main__":
    main()
