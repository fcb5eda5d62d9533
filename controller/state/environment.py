"""The worker environment contract: what every placed process finds in ``os.environ``.

The rule behind it: code written for torchrun, Ray Train, OpenRLHF, slime, verl or RLinf
runs unchanged, and ``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`` selects the
process's own first device in every mode.

Who sets the visible-devices variable (``CUDA_VISIBLE_DEVICES`` for GPUs):

* **Ray**, wherever Ray's own assignment is the plan: an isolated process with one
  accelerator, and an engine that places its workers itself (``engine: vllm``). Ray
  then sets the variable from the bundle it scheduled the process into, and placectl
  sets the switch ``RAY_EXPERIMENTAL_NOSET_*`` to ``""`` (off for Ray and for frameworks
  that test it for truth). Nothing placectl chose is inherited by the process's own Ray
  children, which get their devices from Ray too.
* **placectl**, with the switch set to ``"1"``, where Ray cannot express the plan: a
  process holding several accelerators, one sharing its node's accelerators
  (``isolate: false``), and one that holds no accelerator (it sees none). Ray passes a
  runtime environment on to children, so such a process starts its Ray children with
  :meth:`Assignment.child_options`, which sets their own devices.

verl, OpenRLHF and slime read the switch ``"1"`` as "every accelerator of the node is
visible" and then use the physical id as the device index; keeping the switch off for
isolated processes is what lets them run on placectl unchanged.
"""

from __future__ import annotations

from controller.errors import PlacementError
from controller.planning.placement import Placement
from controller.planning.spec import ClusterSpec
from controller.state import process_start

# Ray resource name -> the variable that selects devices, as Ray's accelerator managers use.
VISIBLE_DEVICES = {
    "GPU": "CUDA_VISIBLE_DEVICES",
    "NPU": "ASCEND_RT_VISIBLE_DEVICES",
    "HPU": "HABANA_VISIBLE_MODULES",
    "TPU": "TPU_VISIBLE_CHIPS",
    "neuron_cores": "NEURON_RT_VISIBLE_CORES",
    "MLU": "MLU_VISIBLE_DEVICES",
    "RBLN": "RBLN_DEVICES",
}
VLLM = "vllm"

# RLinf's names for where a process runs, set as its WorkerGroup sets them, so a process
# written for RLinf's scheduler finds them (scripts/conformance/conformance_rlinf_env.py compares).
RLINF_PLACEMENT = (
    "CLUSTER_NODE_RANK",
    "LOCAL_ACCELERATOR_RANK",
    "ISOLATE_ACCELERATOR",
    "LOCAL_HARDWARE_RANKS",
    "NODE_GROUP_LABEL",
)
PROTECTED = frozenset(
    {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "NODE_LOCAL_RANK",
        "NODE_LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        *RLINF_PLACEMENT,
        "PLACECTL_JOB",
        "PLACECTL_UID",
        "PLACECTL_COMPONENT",
        "PLACECTL_EPOCH",
        "PLACECTL_NODE_GROUP",
        "PLACECTL_CONTROLLER",
        "PLACECTL_BUNDLE_INDICES",
        "PLACECTL_CHILD_SHARE",
        "PLACECTL_WORKER",  # set by clients.WorkerGroup: the tag its processes inherit
        "PLACECTL_STANDBY",  # set on a standby process until it is promoted
        # set by clients.WorkerGroup for an engine rank, from its leases
        "PLACECTL_SERVER_PORT",
        "PLACECTL_CPU_UNITS",
        "PLACECTL_NODE_CPUS",
        "VLLM_RAY_BUNDLE_INDICES",
        "VLLM_RAY_PER_WORKER_GPUS",
        *VISIBLE_DEVICES.values(),
        *(f"RAY_EXPERIMENTAL_NOSET_{v}" for v in VISIBLE_DEVICES.values()),
        # where placectl carries them on Ray before 2.60 (controller.state.process_start)
        *(f"{process_start.PREFIX}{v}" for v in VISIBLE_DEVICES.values()),
    }
)


def visible_devices_variable(accelerator: str) -> str:
    """The visible-devices variable for a Ray accelerator resource (GPU -> CUDA_...)."""
    return VISIBLE_DEVICES.get(accelerator, f"{accelerator.upper()}_VISIBLE_DEVICES")


def noset_variable(accelerator: str) -> str:
    """Ray's switch that stops it from setting the visible-devices variable."""
    return f"RAY_EXPERIMENTAL_NOSET_{visible_devices_variable(accelerator)}"


def ray_sets_devices(placement: Placement, engine: str | None) -> bool:
    """Whether Ray's own assignment gives the process the devices the plan gives it."""
    if placement.local_gpu_id < 0:
        return False
    if engine == VLLM:
        return True
    return placement.isolate_gpu and len(placement.cuda_visible_devices) == 1


def group_env(spec: ClusterSpec, label: str, node_rank: int) -> tuple[dict[str, str], str | None]:
    """Variables and interpreter a node group's ``env_configs`` give one of its nodes."""
    env: dict[str, str] = {}
    interpreter = None
    for group in spec.node_groups:
        if group.label != label:
            continue
        for cfg in group.env_configs:
            if cfg.node_ranks is None or node_rank in cfg.node_ranks:
                env.update(cfg.env_vars)
                interpreter = cfg.python_interpreter_path or interpreter
    return env, interpreter


def check_user_env(env: dict[str, str], source: str) -> None:
    """Refuse variables placectl owns.

    Raises:
        PlacementError: ``env`` sets a protected key; the message names it.
    """
    clash = sorted(set(env) & PROTECTED)
    if clash:
        raise PlacementError(
            f"{source} sets {', '.join(clash)}, which placectl owns; remove "
            f"{'it' if len(clash) == 1 else 'them'} (placectl-owned keys: RANK, WORLD_SIZE, "
            "LOCAL_RANK, MASTER_ADDR, MASTER_PORT, the visible-devices variable, PLACECTL_*, ...)"
        )


def local_rank(placement: Placement) -> int:
    """``LOCAL_RANK``: the index of the process's first accelerator within its
    visible-devices list; for a process without one, its index on the node."""
    if placement.local_gpu_id < 0:
        return placement.local_rank
    return placement.cuda_visible_devices.index(placement.local_gpu_id)


def worker_env(
    spec: ClusterSpec,
    job: str,
    uid: str,
    epoch: int,
    placement: Placement,
    master_addr: str,
    master_port: int | None,
    *,
    engine: str | None = None,
    bundle_indices: list[int] | None = None,
    node_group_env: dict[str, str] | None = None,
) -> dict[str, str]:
    """The complete environment of one process (``placement`` with physical ids).

    Args:
        engine: the component's engine (``vllm``), if any.
        bundle_indices: for an engine, the bundle of each accelerator it holds, in
            visible-device order; its children go there.
        node_group_env: the node group's variables for this node, already checked
            (callers placing many processes look them up once per node).

    Raises:
        PlacementError: a node group's ``env_vars`` set a key placectl owns.
    """
    var = visible_devices_variable(spec.accelerator)
    if node_group_env is None:
        env, _ = group_env(spec, placement.node_group, placement.node_rank)
        check_user_env(env, "node group env_vars")
    else:
        env = dict(node_group_env)
    by_ray = ray_sets_devices(placement, engine)
    devices = (
        placement.cuda_visible_devices[:1] if engine == VLLM else placement.cuda_visible_devices
    )
    isolated_device = placement.local_gpu_id >= 0 and placement.isolate_gpu
    env.update(
        {
            "RANK": str(placement.rank),
            "WORLD_SIZE": str(placement.world_size),
            "LOCAL_RANK": str(local_rank(placement) if engine != VLLM else 0),
            "LOCAL_WORLD_SIZE": "1" if isolated_device else str(placement.local_world_size),
            "NODE_LOCAL_RANK": str(placement.local_rank),
            "NODE_LOCAL_WORLD_SIZE": str(placement.local_world_size),
            "NODE_RANK": str(placement.placement_node_rank),
            "MASTER_ADDR": master_addr,
            "CLUSTER_NODE_RANK": str(placement.node_rank),
            "LOCAL_ACCELERATOR_RANK": str(placement.local_gpu_id),
            "ISOLATE_ACCELERATOR": "1" if placement.isolate_gpu else "0",
            "LOCAL_HARDWARE_RANKS": ",".join(str(r) for r in placement.local_resource_ranks),
            "NODE_GROUP_LABEL": placement.node_group,
            "PLACECTL_JOB": job,
            "PLACECTL_UID": uid,
            "PLACECTL_COMPONENT": placement.component,
            "PLACECTL_EPOCH": str(epoch),
            "PLACECTL_NODE_GROUP": placement.node_group,
            var: ",".join(str(g) for g in devices),
            noset_variable(spec.accelerator): "" if by_ray else "1",
        }
    )
    if master_port is not None:
        env["MASTER_PORT"] = str(master_port)
    if bundle_indices is not None and placement.child_share > 0:
        indices = ",".join(str(b) for b in bundle_indices)
        env["PLACECTL_BUNDLE_INDICES"] = indices
        env["PLACECTL_CHILD_SHARE"] = f"{placement.child_share:g}"
        if engine == VLLM:
            env["VLLM_RAY_BUNDLE_INDICES"] = indices
            env["VLLM_RAY_PER_WORKER_GPUS"] = f"{placement.child_share:g}"
    return env
