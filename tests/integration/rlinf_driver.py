"""An RLinf driver, as an RLinf user writes one, on a placectl reservation.

Run by tests/integration/test_rlinf.py and scripts/bench/bench_rlinf.py in a process of its own
(RLinf's ``Cluster`` is one per process and starts Ray itself)::

    python rlinf_driver.py JOB CONFIG OUT [--own] [--hold SECONDS]

It creates the cluster (placectl's ``ReservedCluster``, or RLinf's own ``Cluster`` with
``--own``), launches one RLinf ``Worker`` group per component of CONFIG's
``cluster.component_placement`` through RLinf's ``create_group().launch``, and writes
to OUT (JSON) what each worker saw, what a gloo group formed from RLinf's environment
summed, what RLinf's send/recv carried between the first and the last component, and how
long each step took. With ``--hold`` it then stays alive, so a test can kill it.
"""

from __future__ import annotations

import json
import os
import sys
import time

from omegaconf import OmegaConf
from rlinf.scheduler import Worker


class Probe(Worker):
    """An RLinf worker that reports what it was given."""

    def __init__(self):
        super().__init__()
        _gloo_without_nccl()

    def facts(self) -> dict:
        import ray

        ctx = ray.get_runtime_context()
        keys = (
            "RANK",
            "WORLD_SIZE",
            "NODE_RANK",
            "CLUSTER_NODE_RANK",
            "LOCAL_ACCELERATOR_RANK",
            "LOCAL_HARDWARE_RANKS",
            "ISOLATE_ACCELERATOR",
            "LOCAL_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "CUDA_VISIBLE_DEVICES",
            "PLACECTL_UID",
            "PLACECTL_EPOCH",
            "PLACECTL_COMPONENT",
        )
        return {
            "rank": self._rank,
            "world_size": self._world_size,
            "cluster_node_rank": self._cluster_node_rank,
            "node_id": ctx.get_node_id(),
            "actor_id": ctx.get_actor_id(),
            "placement_group_id": ctx.get_placement_group_id(),
            "resources": ctx.get_assigned_resources(),
            "ray_gpu_ids": ctx.get_accelerator_ids().get("GPU", []),
            "env": {k: os.environ.get(k) for k in keys},
        }

    def gloo_sum(self) -> float:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="env://", timeout=_timeout())
        t = torch.tensor([float(self._rank + 1)])
        dist.all_reduce(t)
        dist.destroy_process_group()
        return float(t.item())

    def send_to(self, group: str, rank: int, value: float) -> None:
        import torch

        self.send(torch.full((4,), value), dst_group_name=group, dst_rank=rank)

    def recv_from(self, group: str, rank: int) -> list[float]:
        return self.recv(src_group_name=group, src_rank=rank).tolist()


def _gloo_without_nccl() -> None:
    """The GPUs here are Ray's fake ones and torch is a CPU build, without NCCL: RLinf's own
    rule for an accelerator type it has no collective library for is gloo, so say so."""
    import torch.distributed as dist
    from rlinf.scheduler.hardware.accelerators.accelerator import (
        AcceleratorType,
        AcceleratorUtil,
    )

    if not dist.is_nccl_available() and AcceleratorType.NV_GPU in AcceleratorUtil.CCL_SUPPORT_LIST:
        AcceleratorUtil.CCL_SUPPORT_LIST.remove(AcceleratorType.NV_GPU)


def _recipe() -> str:
    import pathlib
    import re

    page = pathlib.Path(__file__).resolve().parents[2] / "docs" / "guides" / "rlinf.md"
    found = re.search(r"```python\n# recipe: rlinf-node-loss\n(.*?)```", page.read_text(), re.S)
    if found is None:
        raise SystemExit("docs/guides/rlinf.md lost its node-loss recipe")
    return found.group(1)


def _timeout():
    import datetime

    return datetime.timedelta(seconds=120)


def main(argv: list[str]) -> int:
    job, config, out = argv[:3]
    own = "--own" in argv
    hold = float(argv[argv.index("--hold") + 1]) if "--hold" in argv else 0.0
    cfg = OmegaConf.load(config)
    t0 = time.monotonic()
    if own:
        from rlinf.scheduler import Cluster
        from rlinf.scheduler.placement import ComponentPlacement

        cluster = Cluster(cluster_cfg=cfg.cluster)
        placement = ComponentPlacement(cfg, cluster)

        def strategy(name):
            return placement.get_strategy(name)

    names = [c.strip() for key in cfg.cluster.component_placement for c in str(key).split(",")]
    if own:
        t_cluster = time.monotonic() - t0
        groups = {}
        for name in names:
            groups[name] = Probe.create_group().launch(
                cluster, placement_strategy=strategy(name), name=f"{job}-{name}"
            )
    else:  # the node-loss recipe of docs/guides/rlinf.md, as written there
        up: list[float] = []

        class Timed(Probe):  # the cluster is up when the recipe creates its first group
            @classmethod
            def create_group(cls, *args, **kwargs):
                up.append(time.monotonic() - t0)
                return Probe.create_group(*args, **kwargs)

        scope = {"job": job, "cfg": cfg, "names": names, "Worker": Timed}
        exec(compile(_recipe(), "docs/guides/rlinf.md recipe rlinf-node-loss", "exec"), scope)
        groups, t_cluster = scope["groups"], up[0]
    facts = {name: g.facts().wait() for name, g in groups.items()}
    t_launch = time.monotonic() - t0
    sums = {name: g.gloo_sum().wait() for name, g in groups.items()}
    first, last = names[0], names[-1]
    src, dst = 0, len(facts[last]) - 1
    sending = groups[first].execute_on(src).send_to(f"{job}-{last}", dst, 7.0)
    received = groups[last].execute_on(dst).recv_from(f"{job}-{first}", src).wait()[0]
    sending.wait()
    result = {
        "facts": facts,
        "gloo": sums,
        "sendrecv": {"from": [first, src], "to": [last, dst], "received": received},
        "seconds": {"cluster": t_cluster, "launch": t_launch},
        "driver_node": __import__("ray").get_runtime_context().get_node_id(),
    }
    with open(out, "w") as f:
        json.dump(result, f)
    print("driver: written", flush=True)
    if hold:
        time.sleep(hold)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
