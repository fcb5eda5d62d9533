"""The worker environment contract: what every placed process finds in ``os.environ``.

placectl sets the visible-devices variable itself for every process it places and turns
Ray's own setting off with the matching ``RAY_EXPERIMENTAL_NOSET_*`` switch, so one rule
covers isolated, shared and multi-accelerator processes alike.
"""

from __future__ import annotations

from controller.errors import PlacementError
from controller.placement import Placement
from controller.spec import ClusterSpec

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

PROTECTED = frozenset(
    {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "PLACECTL_JOB",
        "PLACECTL_COMPONENT",
        "PLACECTL_EPOCH",
        "PLACECTL_NODE_GROUP",
        "PLACECTL_CONTROLLER",
        *VISIBLE_DEVICES.values(),
        *(f"RAY_EXPERIMENTAL_NOSET_{v}" for v in VISIBLE_DEVICES.values()),
    }
)


def visible_devices_variable(accelerator: str) -> str:
    """The visible-devices variable for a Ray accelerator resource (GPU -> CUDA_...)."""
    return VISIBLE_DEVICES.get(accelerator, f"{accelerator.upper()}_VISIBLE_DEVICES")


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


def worker_env(
    spec: ClusterSpec,
    job: str,
    epoch: int,
    placement: Placement,
    master_addr: str,
    master_port: int | None,
    user_env: dict[str, str] | None = None,
) -> dict[str, str]:
    """The complete environment of one process.

    Raises:
        PlacementError: ``user_env`` (or a node group's ``env_vars``) sets a key placectl
            owns; the message names the key.
    """
    var = visible_devices_variable(spec.accelerator)
    env, _ = group_env(spec, placement.node_group, placement.node_rank)
    for source, extra in (("node group env_vars", env), ("env", user_env or {})):
        clash = sorted(set(extra) & PROTECTED)
        if clash:
            raise PlacementError(
                f"{source} sets {', '.join(clash)}, which placectl owns; remove "
                f"{'it' if len(clash) == 1 else 'them'} (placectl-owned keys: RANK, "
                f"WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, {var}, PLACECTL_*, ...)"
            )
    env = {**env, **(user_env or {})}
    env.update(
        {
            "RANK": str(placement.rank),
            "WORLD_SIZE": str(placement.world_size),
            "LOCAL_RANK": str(placement.local_rank),
            "LOCAL_WORLD_SIZE": str(placement.local_world_size),
            "NODE_RANK": str(placement.placement_node_rank),
            "MASTER_ADDR": master_addr,
            "PLACECTL_JOB": job,
            "PLACECTL_COMPONENT": placement.component,
            "PLACECTL_EPOCH": str(epoch),
            "PLACECTL_NODE_GROUP": placement.node_group,
            var: ",".join(str(g) for g in placement.cuda_visible_devices),
            f"RAY_EXPERIMENTAL_NOSET_{var}": "1",
        }
    )
    if master_port is not None:
        env["MASTER_PORT"] = str(master_port)
    return env
