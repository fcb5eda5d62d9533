"""An OpenRLHF driver on a placectl reservation, run by tests/integration/test_openrlhf.py in
a process of its own (OpenRLHF's actors belong to their driver, and its launcher imports
vLLM, stood in for by ``openrlhf_site`` on the PYTHONPATH)::

    python openrlhf_driver.py JOB LAYOUT OUT [--hold SECONDS]

It reserves ``LAYOUTS[LAYOUT]`` for JOB (or finds it reserved), starts OpenRLHF's actor
groups through ``ReservedActorGroup`` and its vLLM engines through placectl's
``create_vllm_engines``, and writes to OUT (JSON) what each actor saw, what a gloo group
formed from OpenRLHF's environment summed, what OpenRLHF's batch dispatch gave each
actor, and what each engine worker was given. With ``--hold`` it then stays alive, so a
test can kill it.
"""

from __future__ import annotations

import json
import os
import sys
import time

import ray
from openrlhf.trainer.ray.launcher import BaseModelActor

import clients
from clients.integrations.openrlhf import ReservedActorGroup, create_vllm_engines

LAYOUTS = {
    # OpenRLHF's --colocate_all: actor, ref and two TP-2 vLLM engines on the same 4 GPUs
    "colocated": {
        "num_nodes": 3,  # the cluster: a head without GPUs and two GPU nodes
        "component_placement": {
            "actor,ref": "0-3",
            "rollout": {"placement": "0-3:0-1", "engine": "vllm"},
        },
    },
    # separate GPUs: training on node 0, four single-GPU engines (uni executor) on node 1
    "separate": {
        "num_nodes": 3,  # the cluster: a head without GPUs and two GPU nodes
        "component_placement": {"actor": "0-3", "rollout": "4-7"},
    },
}
DUPLICATE = {"colocated": 2, "separate": 1}  # OpenRLHF's ring_attn_size * tensor_parallel
BATCH = list(range(10))
KEYS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
    "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",
    "PLACECTL_UID",
    "PLACECTL_EPOCH",
)


class _Strategy:
    """What OpenRLHF's ``execute_batch`` asks of a DeepSpeed strategy."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def is_rank_0(self) -> bool:
        return self.rank == 0


@ray.remote(num_gpus=1)
class Trainer(BaseModelActor):
    """An OpenRLHF model actor that loads no model and reports what it was given."""

    def init_model_from_pretrained(self, *_args, **_kwargs):
        self.strategy = _Strategy(self._rank)

    def facts(self) -> dict:
        ctx = ray.get_runtime_context()
        return {
            "rank": self._rank,
            "world_size": self._world_size,
            "master": list(self.get_master_addr_port()),
            "env": {k: os.environ.get(k) for k in KEYS},
            "node_id": ctx.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "placement_group_id": ctx.get_placement_group_id(),
            "ray_gpu_ids": [int(g) for g in ctx.get_accelerator_ids()["GPU"]],
            "resources": ctx.get_assigned_resources(),
            "actor_id": ctx.get_actor_id(),
        }

    def gloo_sum(self) -> float:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")  # env://, as OpenRLHF's constructor left it
        value = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(value)
        dist.destroy_process_group()
        return value.item()

    def score(self, value: int) -> list[int]:
        return [self._rank, value]


def launch(res, layout: str) -> dict:
    out: dict = {"facts": {}, "gloo": {}, "timing": {}}
    t0 = time.monotonic()
    groups = {"actor": ReservedActorGroup(res, "actor", Trainer, DUPLICATE[layout])}
    if "ref" in res.components:
        groups["ref"] = ReservedActorGroup(res, "ref", Trainer, DUPLICATE[layout])
    for name, group in groups.items():
        ray.get(group.async_init_model_from_pretrained())
        out["facts"][name] = ray.get(group.async_run_method("facts"))
        out["gloo"][name] = ray.get(group.async_run_method("gloo_sum"))
    out["timing"]["groups"] = time.monotonic() - t0
    out["batch"] = ray.get(groups["actor"].async_run_method_batch("score", value=BATCH))
    engines = create_vllm_engines(res, "rollout", "stand-in-model", 7, False, False, True, 256)
    tp = len(res.assignments("rollout")[0].placement.local_resource_ranks)
    world = 1 + len(engines) * tp  # OpenRLHF's weight-sync group: actor rank 0 + workers
    out["engines"] = ray.get(
        [
            e.init_process_group.remote("addr", 1234, 1 + i * tp, world, "sync", "gloo", False)
            for i, e in enumerate(engines)
        ]
    )
    out["timing"]["all"] = time.monotonic() - t0
    out["uid"], out["epoch"] = res.uid, res.epoch
    return out


def main(argv: list[str]) -> int:
    job, layout, path = argv[1], argv[2], argv[3]
    hold = float(argv[argv.index("--hold") + 1]) if "--hold" in argv else 0.0
    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), logging_level="WARNING")
    res = clients.connect().reserve(job, LAYOUTS[layout], timeout_s=300)
    res.wait_ready(timeout=300)
    result = launch(res, layout)
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
    if hold:
        time.sleep(hold)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
