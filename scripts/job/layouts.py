#!/usr/bin/env python3
"""Colocated and disaggregated RL layouts on a local simulated GPU cluster.

Starts a real local Ray cluster (a head and three nodes of 4 simulated GPUs, each its
own raylet), starts the placectl controller, reserves a colocated layout (actor and
rollout sharing every GPU, a two-GPU inference engine with child-task capture) and a
disaggregated one (training and generation on separate GPUs, a CPU-only reward
service), launches worker groups that run a gloo all-reduce with the environment they
were given, prints the placement maps and the results, releases everything and stops
the cluster. No GPU needed.
"""

from __future__ import annotations

import os
import sys
import time

import ray

import clients
from clients.render import render_reservation
from clients.testing.local import local_cluster

GPU_NODES, GPUS = 3, 4
COLOCATED = {
    "num_nodes": 1 + GPU_NODES,
    "component_placement": {
        "actor,rollout": "0-7",  # 8 processes each, sharing GPUs 0-7 (nodes 1-2)
        "engine": {"placement": "0-7:0-3", "capture_child_tasks": True},  # 2 GPUs each
    },
}
DISAGGREGATED = {
    "num_nodes": 1 + GPU_NODES,
    "node_groups": [
        {"label": "train", "node_ranks": 3},
        {"label": "gen", "node_ranks": 3},
    ],
    "component_placement": {
        "actor": {"node_group": "train", "placement": "0-1"},
        "rollout": {"node_group": "gen", "placement": "2-3"},
        "reward": {"node_group": "node", "placement": "0:0-1"},  # CPU only, on the head
    },
}
T0 = time.monotonic()


def say(message: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {message}", flush=True)


@ray.remote(num_cpus=0)
def _child():
    return ray.get_runtime_context().get_placement_group_id()


class Worker:
    """What a training or rollout process would be: it reads its environment and joins
    a torch.distributed group through it, with no other configuration."""

    def report(self) -> dict:
        import torch
        import torch.distributed as dist

        env = os.environ
        dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
        value = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(value)
        dist.destroy_process_group()
        child_group = ray.get(_child.remote())
        return {
            "rank": int(env["RANK"]),
            "world": int(env["WORLD_SIZE"]),
            "devices": env["CUDA_VISIBLE_DEVICES"] or "-",
            "local_rank": env["LOCAL_RANK"],
            "master": f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}",
            "sum": value.item(),
            "child_in_group": child_group is not None
            and child_group == ray.get_runtime_context().get_placement_group_id(),
        }


def run_job(ctl, job: str, spec: dict) -> bool:
    say(f"reserving {job!r}")
    res = ctl.reserve(job, spec, timeout_s=120, progress=lambda m: say(f"  {job}: {m}"))
    say(f"reserved {job!r}: {res.info.num_accelerators} GPUs on {len(res.info.slots)} node(s)")
    print(render_reservation(res.info, {c: res.assignments(c) for c in res.components}))
    groups = {}
    for component in res.components:
        say(f"launching {job}/{component}: {len(res.assignments(component))} workers")
        groups[component] = clients.WorkerGroup.launch(res, component, Worker)
    refs = {c: g.execute_async("report") for c, g in groups.items()}
    ok = True
    for component, group_refs in refs.items():
        reports = ray.get(group_refs)
        n = len(reports)
        expected = n * (n + 1) / 2
        good = all(r["sum"] == expected for r in reports)
        ok &= good
        capture = res.assignments(component)[0].capture_child_tasks
        say(
            f"{job}/{component}: gloo all_reduce over {n} ranks = {reports[0]['sum']:g} "
            f"(expected {expected:g}) {'OK' if good else 'WRONG'}; master {reports[0]['master']}"
            + ("; child tasks stay in the reservation" if capture else "")
        )
        for r in reports:
            print(
                f"    rank {r['rank']:>2}  devices {r['devices']:<4} local_rank {r['local_rank']}"
                f"  child in group: {r['child_in_group']}"
            )
        ok &= all(r["child_in_group"] == capture for r in reports)
    for group in groups.values():
        group.shutdown()
    return ok


def main() -> int:
    say(f"starting a local Ray cluster: head + {GPU_NODES} nodes x {GPUS} simulated GPUs")
    with local_cluster(GPU_NODES, gpus=GPUS, log_level="ERROR"):
        say("starting the placectl controller")
        ctl = clients.connect()
        ok = run_job(ctl, "colocated", COLOCATED)
        ok &= run_job(ctl, "disaggregated", DISAGGREGATED)
        say("releasing every reservation")
        ctl.release_all()
        ctl.stop()
        say("stopping the cluster")
    say("demo " + ("succeeded" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
