"""The ``cluster:`` block as written: strict msgspec Structs that decode a YAML document.

Unknown keys and wrong types are errors whose messages name the key path; meaning is
checked later, in :mod:`controller.planning.spec`.
"""

from __future__ import annotations

from typing import Any

import msgspec


class _Strict(msgspec.Struct, forbid_unknown_fields=True):
    pass


class _Ports(_Strict):
    low: int = 20000
    high: int = 29999


class _EnvConfig(_Strict):
    node_ranks: int | str = "all"
    env_vars: list[dict[str, Any]] | dict[str, Any] = []
    python_interpreter_path: str | None = None


class _Hardware(_Strict):
    type: str
    configs: list[Any] = []


class _NodeGroup(_Strict):
    label: str | int
    node_ranks: int | str | None = None
    env_configs: list[_EnvConfig] = []
    hardware: _Hardware | None = None
    ignore_hardware: bool = False
    selector: dict[str, str] | None = None
    count: int | None = None


class _Topology(_Strict):
    segment: int
    within: str = "nvlink-domain"
    on_loss: str = "wait"


class _Component(_Strict):
    placement: int | str
    node_group: str | int | list[str | int] | None = None
    capture_child_tasks: bool | None = None
    accelerator_share: float | None = None
    isolate: bool | None = None
    engine: str | None = None
    child_share: float | None = None
    topology: _Topology | None = None
    standby: bool = False
    on_loss: str = "repair"
    take_spares: bool = False


# Keys RLinf's own configurations carry in their cluster block that say nothing about
# placement (its dynamic scheduler, network emulation, tracing, profiling): accepted,
# kept in the spec, unused.
RLINF_UNUSED = (
    "auto_scheduler",
    "use_pre_process_policy",
    "use_wait_before_last_iter_policy",
    "recreate_nccl_groups",
    "net_emulation",
    "tracer",
    "profiling",
    "nsight",
)


class _Cluster(_Strict):
    num_nodes: int
    component_placement: dict[str, Any]
    accelerator: str = "GPU"
    cpus_per_accelerator: float = 1.0
    ports: _Ports = msgspec.field(default_factory=_Ports)
    node_groups: list[_NodeGroup] = []
    num_gpus_per_node: int | None = None  # RLinf's older key; the dry run's default
    spares: int = 0  # placectl's own: whole nodes held ready for a repair
    auto_scheduler: Any = None
    use_pre_process_policy: Any = None
    use_wait_before_last_iter_policy: Any = None
    recreate_nccl_groups: Any = None
    net_emulation: Any = None
    tracer: Any = None
    profiling: Any = None
    nsight: Any = None
