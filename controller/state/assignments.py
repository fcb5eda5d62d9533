"""What one process needs to start in its bundle, derived from a plan and its slots."""

from __future__ import annotations

from typing import Any

import msgspec

from controller.errors import PlacementError
from controller.planning.colocation import floor_share
from controller.planning.node_groups import ACCELERATOR, HARDWARE
from controller.planning.placement import Placement
from controller.ray_versions import NARROW_DEVICES, has, installed
from controller.state import process_start, scheduling
from controller.state.environment import (
    check_user_env,
    group_env,
    noset_variable,
    ray_sets_devices,
    visible_devices_variable,
    worker_env,
)
from controller.state.plan import BundleKey, JobPlan, bundle_key
from controller.state.records import BundleRecord, ReservationRecord, SlotRecord


class Assignment(msgspec.Struct, kw_only=True, frozen=True):
    """What one process needs to start in its bundle.

    Attributes:
        placement: where it runs, with the real node id and IP and physical accelerator
            ids in ``cuda_visible_devices`` / ``local_gpu_id``.
        placement_group_id, bundle_index: the group (hex id) and bundle it starts in:
            for a process with several accelerators, the bundle of its first one.
        num_gpus, num_cpus, resources: what it requests from that bundle.
        capture_child_tasks: its Ray children stay in the reservation.
        env: its complete environment (the worker contract).
        epoch, uid: the reservation's epoch and identity these values belong to.
        python: the node group's interpreter, if it names one.
        bundle_indices: the bundle of every accelerator it holds, in the order of its
            devices; an engine's i-th child starts in ``bundle_indices[i]``.
        child_share: the fraction of an accelerator each of its children requests.
        device_uuids, pci_bus_ids: the identity of each visible device (NVIDIA only).
        ray_sets_devices: Ray sets the visible-devices variable from the bundle
            (isolated single-accelerator processes, vLLM engines); else placectl does.
    """

    placement: Placement
    placement_group_id: str
    bundle_index: int
    num_gpus: float
    num_cpus: float
    capture_child_tasks: bool
    env: dict[str, str]
    epoch: int
    uid: str = ""
    resources: dict[str, float] = {}
    python: str | None = None
    bundle_indices: list[int] = []
    child_share: float = 0.0
    accelerator: str = "GPU"
    device_uuids: list[str] = []
    pci_bus_ids: list[str] = []
    ray_sets_devices: bool = False

    def runtime_env_vars(self, ray_version: str | None = None) -> dict[str, str]:
        """The variables to hand Ray: ``env`` without what Ray sets itself. On a Ray
        (``ray_version``, default the installed one) before 2.60, visible devices that
        placectl sets travel under another name and are set as the process starts
        (:mod:`controller.state.process_start`)."""
        env = dict(self.env)
        variable = visible_devices_variable(self.accelerator)
        if self.ray_sets_devices:
            env.pop(variable, None)
        elif env.get(variable) and not _ray_has_narrow_devices(ray_version):
            env.update(process_start.carried(variable, env.pop(variable)))
        return env

    def _strategy(self, bundle_index: int, capture: bool) -> Any:
        return scheduling.strategy(self.placement_group_id, bundle_index, capture)

    def _request(self, share: float) -> dict[str, Any]:
        if self.accelerator == "GPU":
            return {"num_gpus": share}
        return {"num_gpus": 0, "resources": {self.accelerator: share}} if share else {}

    def actor_options(self, ray_version: str | None = None) -> dict[str, Any]:
        """Keyword arguments for ``Actor.options(**...)`` that start the process here
        (on Ray ``ray_version``, default the installed one)."""
        options: dict[str, Any] = {
            "num_gpus": self.num_gpus,
            "num_cpus": self.num_cpus,
            "scheduling_strategy": self._strategy(self.bundle_index, self.capture_child_tasks),
            "runtime_env": {"env_vars": self.runtime_env_vars(ray_version)},
        }
        if self.python:
            options["runtime_env"]["py_executable"] = self.python
        if self.resources:
            options["resources"] = dict(self.resources)
        return options

    def child_options(
        self, i: int, num_cpus: float = 0.0, ray_version: str | None = None
    ) -> dict[str, Any]:
        """Options that start this engine's ``i``-th child on its ``i``-th accelerator.

        The child requests ``child_share`` of that accelerator in its bundle (so it
        never lands on another process's accelerator and never waits for room), sees
        exactly that device, and stays in the reservation. Ray sets the child's device
        from that request; on Ray 2.60 and later the variable names it too (before 2.60
        Ray would map its slot through that one-device list and fail).

        Raises:
            PlacementError: the process is not an engine, or ``i`` is out of range.
        """
        if self.child_share <= 0:
            raise PlacementError(
                f"{self.placement.component}:{self.placement.rank} starts no children: set "
                "capture_child_tasks: true (or engine: vllm) on the component"
            )
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(self.bundle_indices):
            raise PlacementError(
                f"child {i!r}: out of range; {self.placement.component}:{self.placement.rank} "
                f"holds {len(self.bundle_indices)} accelerators (0-{len(self.bundle_indices) - 1})"
            )
        device = self.placement.cuda_visible_devices[i]
        env = {
            noset_variable(self.accelerator): "",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "PLACECTL_CHILD_INDEX": str(i),
        }
        if _ray_has_narrow_devices(ray_version):
            env[visible_devices_variable(self.accelerator)] = str(device)
        options = {
            **self._request(self.child_share),
            "num_cpus": num_cpus,
            "scheduling_strategy": self._strategy(self.bundle_indices[i], True),
            "runtime_env": {"env_vars": env},
        }
        return options


def _ray_has_narrow_devices(ray_version: str | None) -> bool:
    return has(NARROW_DEVICES, installed() if ray_version is None else ray_version)


def _bundle_key(p: Placement) -> tuple[int, str, str, int]:
    local = p.local_resource_ranks[0] if p.kind == HARDWARE else -1
    return (p.node_rank, p.kind, p.hardware, local)


def _sharers(plan: JobPlan) -> dict[tuple[int, str, str, int], int]:
    """Processes per node/hardware bundle, for splitting that bundle's CPUs and units."""
    counts: dict[tuple[int, str, str, int], int] = {}
    for comp in plan.components:
        for p in comp.placements:
            if p.kind != ACCELERATOR:
                key = _bundle_key(p)
                counts[key] = counts.get(key, 0) + 1
    return counts


Found = tuple[SlotRecord, int, BundleRecord]  # the slot, the bundle's index in it, the bundle


class Located:
    """Every bundle of a reservation by node rank and what it is for (a node may hold
    several slots): accelerators by planned local index, the rest by bundle key."""

    def __init__(self, res: ReservationRecord) -> None:
        self.accelerators: dict[int, dict[int, Found]] = {}
        self.others: dict[tuple[int, BundleKey], Found] = {}
        for s in res.slots:
            mine = self.accelerators.setdefault(s.node_rank, {})
            for i, b in enumerate(s.bundles):
                if b.kind == ACCELERATOR:
                    mine[b.local_index] = (s, i, b)
                else:
                    self.others[(s.node_rank, bundle_key(b))] = (s, i, b)


def _seen_devices(p: Placement, slot: SlotRecord, located: Located) -> dict[str, Any]:
    """A hardware or node process: the physical ids of the accelerators it sees."""
    on_node = located.accelerators.get(p.node_rank, {})
    visible = [on_node[g][2] for g in p.cuda_visible_devices]
    return {
        "placement": msgspec.structs.replace(
            p,
            node_id=slot.node_id,
            node_ip=slot.node_ip,
            cuda_visible_devices=[b.physical_id for b in visible],
        ),
        "device_uuids": [b.uuid for b in visible] if any(b.uuid for b in visible) else [],
    }


def _accelerator_fields(p: Placement, located: Located) -> tuple[SlotRecord, dict[str, Any]]:
    on_node = located.accelerators[p.node_rank]
    held = [on_node[g] for g in p.local_resource_ranks]
    slot, anchor, first = held[0]
    if len(held) > 1 and any(h[0] is not slot for h in held):
        raise PlacementError(
            f"{p.component}:{p.rank} holds accelerators in several placement groups on node "
            f"rank {p.node_rank}; a process and its children need them in one"
        )
    visible = [on_node[g][2] for g in p.cuda_visible_devices]
    placed = msgspec.structs.replace(
        p,
        node_id=slot.node_id,
        node_ip=slot.node_ip,
        cuda_visible_devices=[b.physical_id for b in visible],
        local_gpu_id=first.physical_id,
    )
    return slot, {
        "placement": placed,
        "bundle_index": anchor,
        "num_cpus": floor_share(first.resources.get("CPU", 0.0) * p.accelerator_share),
        "bundle_indices": [h[1] for h in held],
        "device_uuids": [b.uuid for b in visible] if any(b.uuid for b in visible) else [],
        "pci_bus_ids": [b.pci_bus_id for b in visible]
        if any(b.pci_bus_id for b in visible)
        else [],
    }


def build_assignments(res: ReservationRecord, plan: JobPlan) -> dict[str, list[Assignment]]:
    """Every component's assignments, in rank order, with their environments.

    Args:
        res: a reservation whose slots are created and probed.
        plan: its job plan.

    Raises:
        PlacementError: a node group's env_vars set a variable placectl owns.
    """
    spec = res.spec
    located = Located(res)
    ip_of = {s.node_rank: s.node_ip for s in res.slots}
    sharers = _sharers(plan)
    node_group_env: dict[tuple[str, int], tuple[dict[str, str], str | None]] = {}

    def env_of(label: str, node_rank: int) -> tuple[dict[str, str], str | None]:
        found = node_group_env.get((label, node_rank))
        if found is None:
            found = node_group_env[(label, node_rank)] = group_env(spec, label, node_rank)
            check_user_env(found[0], "node group env_vars")
        return found

    out: dict[str, list[Assignment]] = {}
    for comp in plan.components:
        master = ip_of[comp.placements[0].node_rank]
        port = res.master_port(comp.name)
        engine_like = comp.capture_child_tasks
        items = []
        for p in comp.placements:
            resources: dict[str, float] = {}
            gpus = 0.0
            if p.kind == ACCELERATOR:
                slot, fields = _accelerator_fields(p, located)
                if spec.accelerator == "GPU":
                    gpus = p.accelerator_share
                else:
                    resources = {spec.accelerator: p.accelerator_share}
            else:
                key = _bundle_key(p)
                found = located.others[(p.node_rank, (p.kind, p.hardware or "", key[3]))]
                slot, anchor, bundle = found
                k = sharers[key]
                if p.kind == HARDWARE:
                    resources = {p.hardware: floor_share(1.0 / k)}
                fields = {
                    **_seen_devices(p, slot, located),
                    "bundle_index": anchor,
                    "num_cpus": floor_share(bundle.resources["CPU"] / k),
                }
            placed = fields["placement"]
            indices = fields.get("bundle_indices") if engine_like else None
            group_vars, python = env_of(placed.node_group, placed.node_rank)
            items.append(
                Assignment(
                    **fields,
                    placement_group_id=slot.group_id,
                    num_gpus=gpus,
                    capture_child_tasks=comp.capture_child_tasks,
                    env=worker_env(
                        spec,
                        res.job,
                        res.uid,
                        res.epoch,
                        placed,
                        master,
                        port,
                        engine=comp.engine,
                        bundle_indices=indices,
                        node_group_env=group_vars,
                    ),
                    epoch=res.epoch,
                    uid=res.uid,
                    resources=resources,
                    python=python,
                    child_share=placed.child_share if indices else 0.0,
                    accelerator=spec.accelerator,
                    ray_sets_devices=ray_sets_devices(placed, comp.engine),
                )
            )
        out[comp.name] = items
    return out
