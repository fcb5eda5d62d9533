"""Fake GPUs for RLinf's node probe, in the RLinf test clusters' Ray processes only.

RLinf counts a node's NVIDIA GPUs through Ray's ``NvidiaGPUAcceleratorManager``, which asks
NVML; the test nodes have fake GPUs (Ray's ``num_gpus``) and no NVML. With
``PLACECTL_FAKE_NVML`` set (the RLinf tests set it on their raylets, with this directory on
``PYTHONPATH``), RLinf's node probe actors (named ``NodeProbe_<node id>``) count the GPUs
Ray gives their node, so RLinf's ``Cluster`` knows each node's accelerators and places
workers on them. Every other process sees what this machine has, no GPU: RLinf's workers
then talk over gloo, as they would on CPUs.
"""

import os

if os.environ.get("PLACECTL_FAKE_NVML"):

    def _gpus_seen_by_rlinf_probe() -> int:
        import ray

        if not ray.is_initialized():  # never start Ray: RLinf asks at import time
            return 0
        try:
            ctx = ray.get_runtime_context()
            if not (ctx.get_actor_name() or "").startswith("NodeProbe_"):
                return 0
            me = ctx.get_node_id()
            for n in ray.nodes():
                if n["NodeID"] == me:
                    return int(n["Resources"].get("GPU", 0))
        except Exception:
            return 0
        return 0

    from ray._private.accelerators import nvidia_gpu

    nvidia_gpu.NvidiaGPUAcceleratorManager.get_current_node_num_accelerators = staticmethod(
        _gpus_seen_by_rlinf_probe
    )
