"""What OpenRLHF's actor groups and vLLM engines can take from a reservation, checked
before anything starts. Pure: no OpenRLHF or Ray import, so these rules are unit-tested
on assignments alone.

OpenRLHF 0.11.2 starts every training actor with one GPU (``@ray.remote(num_gpus=1)``)
and sets ``LOCAL_RANK`` itself: ``0``, or the physical id ``ray.get_gpu_ids()[0]``
whenever one of Ray's ``RAY_EXPERIMENTAL_NOSET_*_VISIBLE_DEVICES`` switches is set. placectl
sets that switch (to ``"1"``) exactly where Ray cannot express the plan: a process with
several accelerators, ``isolate: false``, or none at all. OpenRLHF would then select a
device by its physical id in a narrowed (or empty) list, so such components are refused
for training groups. Its vLLM engines hold ``tensor_parallel_size`` GPUs each: one is the
engine process's own (``uni`` executor), several are its Ray workers' bundles, which only
an engine component (``engine: vllm``) lists for them.
"""

from __future__ import annotations

from collections import Counter

from controller.errors import PlacementError
from controller.planning.node_groups import ACCELERATOR
from controller.state.assignments import Assignment
from controller.state.environment import noset_variable

TRAINING_REMEDY = "one accelerator per process and isolate: true"


def _why_noset(a: Assignment) -> str:
    p = a.placement
    if p.kind != ACCELERATOR:
        return f"it holds no accelerator ({p.kind} process)"
    if len(p.local_resource_ranks) > 1:
        return f"it holds {len(p.local_resource_ranks)} accelerators"
    return "isolate: false makes it see every accelerator of its node"


def training_layout(
    component: str, assignments: list[Assignment], duplicate_actors: int
) -> tuple[int, int]:
    """``(num_nodes, num_gpus_per_node)`` of an OpenRLHF actor group on ``component``.

    Raises:
        PlacementError: a process would get Ray's NOSET switch (OpenRLHF would take its
            ``LOCAL_RANK`` from the physical GPU id), or ``duplicate_actors`` is not a
            positive divisor of the component's world size (OpenRLHF's batch dispatch
            would leave ranks without data).
    """
    if isinstance(duplicate_actors, bool) or not isinstance(duplicate_actors, int):
        raise PlacementError(
            f"duplicate_actors {duplicate_actors!r}: expected a positive int "
            "(ring_attn_size * tensor_parallel_size)"
        )
    world = len(assignments)
    if duplicate_actors < 1 or world % duplicate_actors:
        raise PlacementError(
            f"duplicate_actors {duplicate_actors}: must divide {component}'s world size "
            f"{world} (allowed: {', '.join(str(d) for d in range(1, world + 1) if world % d == 0)})"
        )
    for a in assignments:
        var = noset_variable(a.accelerator)
        if a.env.get(var):
            raise PlacementError(
                f"{component}:{a.placement.rank}: OpenRLHF sets LOCAL_RANK to the physical "
                f"GPU id when {var} is set, which placectl sets here because "
                f"{_why_noset(a)}; give {component} {TRAINING_REMEDY}"
            )
    per_node = Counter(a.placement.node_id for a in assignments)
    return len(per_node), max(per_node.values())


def engine_layout(component: str, assignments: list[Assignment]) -> int:
    """The ``tensor_parallel_size`` of OpenRLHF's vLLM engines on ``component``: the
    accelerators each process holds, the same for every process.

    Raises:
        PlacementError: a process holds no accelerator, engines differ in size, or an
            engine with several accelerators is not an engine component.
    """
    sizes = set()
    for a in assignments:
        p = a.placement
        if p.kind != ACCELERATOR:
            raise PlacementError(
                f"{component}:{p.rank} holds no accelerator ({p.kind} process); a vLLM "
                "engine needs at least one"
            )
        size = len(p.local_resource_ranks)
        if size > 1 and a.child_share <= 0:
            raise PlacementError(
                f"{component}:{p.rank} holds {size} accelerators but its component is not "
                f"an engine: set engine: vllm on {component} so its {size} vLLM workers "
                "get a bundle each"
            )
        sizes.add(size)
    if len(sizes) > 1:
        raise PlacementError(
            f"{component}: its processes hold {sorted(sizes)} accelerators; OpenRLHF's "
            "engines share one tensor_parallel_size"
        )
    return sizes.pop() if sizes else 0


__all__ = ["TRAINING_REMEDY", "engine_layout", "training_layout"]
