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

import argparse
import os
import statistics
import sys
import time

import ray
from ray.cluster_utils import Cluster
from ray.util.placement_group import placement_group, remove_placement_group

sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0})
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    ctl = clients.connect()
    times: dict[str, list[float]] = {"placectl": [], "plain": []}
    launched: dict[str, list[int]] = {"placectl": [], "plain": []}
    try:
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
    finally:
        ray.shutdown()
        cluster.shutdown()
    a, b = statistics.median(times["placectl"]), statistics.median(times["plain"])
    print(f"\n== {args.trials} trials, from zero GPU nodes to ready (4-GPU nodes, 8 GPUs asked)")
    for how, med in (("placectl reserve", a), ("plain placement group", b)):
        key = "placectl" if how.startswith("placectl") else "plain"
        xs = ", ".join(f"{x:.2f}" for x in times[key])
        print(f"{how:<24} {med:6.2f}s  ({xs}); nodes launched {launched[key]}")
    print(f"ratio {a / b:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
