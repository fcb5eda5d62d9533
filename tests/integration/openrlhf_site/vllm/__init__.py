"""A stand-in for vLLM (CUDA only) with what OpenRLHF 0.11.2's ``RolloutRayActor`` uses:
``AsyncEngineArgs`` and ``AsyncLLMEngine.from_engine_args``. It loads no model. An engine
with ``distributed_executor_backend="ray"`` starts its workers as vLLM's Ray executor
does: one per bundle named by ``VLLM_RAY_BUNDLE_INDICES``, in the placement group the
engine runs in, each asking ``VLLM_RAY_PER_WORKER_GPUS`` of a GPU and none of a CPU; with
``"uni"`` the engine's own process is its worker. ``collective_rpc`` answers, for every
worker, what Ray gave it."""

from __future__ import annotations

import asyncio
import os

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

__version__ = "0.29.0"

_ENV = (
    "VLLM_RAY_BUNDLE_INDICES",
    "VLLM_RAY_PER_WORKER_GPUS",
    "CUDA_VISIBLE_DEVICES",
    "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",
    "PLACECTL_UID",
    "PLACECTL_EPOCH",
)


def _facts() -> dict:
    ctx = ray.get_runtime_context()
    return {
        "node_id": ctx.get_node_id(),
        "placement_group_id": ctx.get_placement_group_id(),
        "ray_gpu_ids": [int(g) for g in ctx.get_accelerator_ids()["GPU"]],
        "resources": ctx.get_assigned_resources(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "pid": os.getpid(),
    }


@ray.remote
class _Worker:
    def facts(self) -> dict:
        return _facts()


class AsyncEngineArgs:
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


class AsyncLLMEngine:
    def __init__(self, engine_args: AsyncEngineArgs):
        self.kwargs = engine_args.kwargs
        self.engine_env = {k: os.environ.get(k) for k in _ENV}
        self.engine_facts = _facts()
        self.workers = []
        if self.kwargs.get("distributed_executor_backend") == "ray":
            indices = [int(b) for b in os.environ["VLLM_RAY_BUNDLE_INDICES"].split(",")]
            share = float(os.environ["VLLM_RAY_PER_WORKER_GPUS"])
            group = ray.util.get_current_placement_group()
            self.workers = [
                _Worker.options(
                    num_cpus=0,
                    num_gpus=share,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=group,
                        placement_group_bundle_index=b,
                        placement_group_capture_child_tasks=True,
                    ),
                ).remote()
                for b in indices
            ]

    @classmethod
    def from_engine_args(cls, engine_args: AsyncEngineArgs) -> AsyncLLMEngine:
        return cls(engine_args)

    async def is_sleeping(self) -> bool:
        return False

    async def sleep(self, level: int = 1) -> None:
        return None

    async def collective_rpc(self, method: str, args: tuple = ()) -> list[dict]:
        if self.workers:
            workers = await asyncio.gather(*[w.facts.remote() for w in self.workers])
        else:
            workers = [self.engine_facts]
        keys = ("model", "seed", "tensor_parallel_size", "distributed_executor_backend")
        return [
            {
                "method": method,
                "args": list(args),
                "engine": self.engine_facts,
                "engine_env": self.engine_env,
                "engine_kwargs": {k: self.kwargs.get(k) for k in keys},
                **w,
            }
            for w in workers
        ]
