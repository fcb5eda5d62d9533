#!/usr/bin/env python3
"""Time to ready from zero GPU nodes: a placectl reservation against a plain Ray
placement group of the same shape, on the same autoscaler.

A local cluster of a head without GPUs, and an autoscaler
(``clients.testing.autoscaler.LocalAutoscaler``) that launches 4-GPU nodes, each a
``ray start --block`` process as a KubeRay pod runs one, only for the demand Ray reports,
and terminates them once idle. Each trial, alternating which goes first, waits until no
GPU node is left, then measures from the call to ready: ``ctl.reserve(job,
{num_nodes: 3, actor: 0-7})`` (placectl asks for the nodes it waits for; ready includes
the probe of every bundle's device and the published assignments), and a PACK placement
group of 8 x {GPU: 1, CPU: 1} (Ray's own demand; ready once placed).

Usage: scripts/bench/bench_autoscaling.py [--trials 3]
"""

from __future__ import annotations

import time

import ray
from harness import Results, local_cluster, parser
from ray.util.placement_group import placement_group, remove_placement_group

import clients
from clients.testing.autoscaler import LocalAutoscaler

SPEC = {"num_nodes": 3, "component_placement": {"actor": "0-7"}}


def gpu_nodes() -> int:
    return sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU"))


def wait_no_gpu_node(timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while gpu_nodes() and time.monotonic() < deadline:
        time.sleep(0.2)
    if gpu_nodes():
        raise SystemExit("the autoscaler did not remove the idle nodes")


def placectl_once(ctl) -> float:
    t0 = time.perf_counter()
    ctl.reserve("bench-autoscale", SPEC, timeout_s=300, progress=lambda m: None)
    took = time.perf_counter() - t0
    ctl.release("bench-autoscale")
    return took


def plain_once() -> float:
    t0 = time.perf_counter()
    pg = placement_group([{"GPU": 1, "CPU": 1}] * 8, strategy="PACK")
    if not pg.wait(timeout_seconds=300):
        raise SystemExit("the plain placement group was not placed in 300s")
    took = time.perf_counter() - t0
    remove_placement_group(pg)
    return took


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()
    results = Results("autoscaling", args)
    times: dict[str, list[float]] = {"placectl": [], "plain": []}
    launched: dict[str, list[int]] = {"placectl": [], "plain": []}
    with local_cluster(0, log_level="ERROR") as (cluster, _):
        ctl = clients.connect()
        with LocalAutoscaler(cluster, idle_timeout_s=2) as scaler:
            for trial in range(args.trials):
                order = ["placectl", "plain"] if trial % 2 == 0 else ["plain", "placectl"]
                for how in order:
                    wait_no_gpu_node()
                    before = len(scaler.launched)
                    took = placectl_once(ctl) if how == "placectl" else plain_once()
                    times[how].append(took)
                    launched[how].append(len(scaler.settle()) - before)
                    print(f"trial {trial} {how}: ready in {took:.2f}s", flush=True)
    results.add("plain", times["plain"], launched=launched["plain"])
    ours = results.add(
        "placectl", times["placectl"], baseline="plain", launched=launched["placectl"]
    )
    print(f"\n== {args.trials} trials, from zero GPU nodes to ready (4-GPU nodes, 8 GPUs asked)")
    for how, key in (("placectl reserve", "placectl"), ("plain placement group", "plain")):
        xs = ", ".join(f"{x:.2f}" for x in times[key])
        med = results.get(key)["median"]
        print(f"{how:<24} {med:6.2f}s  ({xs}); nodes launched {launched[key]}")
    print(f"ratio {ours['ratio']:.2f}")
    results.write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
