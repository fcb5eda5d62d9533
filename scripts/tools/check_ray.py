#!/usr/bin/env python3
"""Does this Ray keep placectl's contract? Two behaviours of Ray placectl relies on, tried
on a local cluster (a head and two raylets with 4 fake GPUs each):

* pinning: a placement group aimed at a node as placectl's controller aims it on this
  Ray (its bundles' label selector ``ray.io/node-id``; Ray 2.48's soft node hint) is
  placed on that node even when another node has room first;
* several devices per process: a process that holds two GPUs of its node through two
  bundles, and whose visible-devices variable placectl sets from the runtime environment
  (``CUDA_VISIBLE_DEVICES=2,3``), starts and runs a task. Ray before 2.60 maps each
  device slot through a list set there and fails with an IndexError at the task's
  start: placectl sets it as the process starts on those releases.

Prints one line per behaviour and exits 1 if one fails. Usage: scripts/tools/check_ray.py
"""

from __future__ import annotations

import os
import sys

import ray
from ray.util.placement_group import (
    placement_group,
    placement_group_table,
    remove_placement_group,
)

import clients
from clients.testing.local import local_cluster
from clients.workers import WorkerGroup
from controller.runtime.edge.ray_io import pin_options

GPUS = 4


@ray.remote
class Seer:
    def seen(self):
        return os.environ.get("CUDA_VISIBLE_DEVICES"), ray.get_runtime_context().get_node_id()


def pinning(nodes: list[str]) -> str:
    """Pin a one-GPU group to each raylet in turn, the way placectl's controller does."""
    for node in (nodes[1], nodes[0]):
        pg = placement_group([{"GPU": 1}], **pin_options(node, 1))
        ray.get(pg.ready(), timeout=60)
        placed = placement_group_table(pg)["bundles_to_node_id"][0]
        remove_placement_group(pg)
        if placed != node:
            return f"placed on {placed[:12]}, asked for {node[:12]}"
    return "ok"


def several_devices(ctl) -> str:
    spec = {"num_nodes": 3, "component_placement": {"actor": "0-3:0-1"}}
    res = ctl.reserve("check-multi", spec, 120)
    want = [
        (",".join(map(str, a.placement.cuda_visible_devices)), a.placement.node_id)
        for a in res.assignments("actor")
    ]
    try:
        group = WorkerGroup.launch(res, "actor", Seer, timeout=120)
        got = [tuple(x) for x in group.execute("seen")]
        group.shutdown()
    finally:
        ctl.release("check-multi")
    return "ok" if got == want else f"sees {got}, assigned {want}"


def main() -> int:
    with local_cluster(2, gpus=GPUS, log_level="ERROR") as (_, added):
        nodes = [node.node_id for node in added]
        ctl = clients.connect()
        results = {}
        for name, check in (
            ("pinning", lambda: pinning(nodes)),
            ("several devices", lambda: several_devices(ctl)),
        ):
            try:
                results[name] = check()
            except Exception as e:  # what an old Ray does is the finding
                results[name] = f"fails: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
    print(f"ray {ray.__version__}")
    for name, result in results.items():
        print(f"  {name:<16} {result}")
    return 0 if all(r == "ok" for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
