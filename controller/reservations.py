"""ReservationRecord records and the pure logic between a plan and Ray's placement groups.

A reservation holds one placement group per (job, node slot). Each slot's bundles are
one per accelerator the job uses on that node (``{ACCEL: 1, "CPU": c}``), one per
hardware unit it uses, and one CPU bundle for its node-level processes. Everything
here is plain data and plain functions; the actor does the Ray I/O.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from controller.cluster import ClusterView
from controller.colocation import GRANULARITY
from controller.components import ComponentPlacement
from controller.environment import group_env, worker_env
from controller.errors import PlacementError
from controller.node_groups import ACCELERATOR, HARDWARE, NODE
from controller.placement import Placement
from controller.ports import MASTER, PortLease
from controller.spec import ClusterSpec, load_spec

TABLE_VERSION = 1
TABLE_KEY = b"reservations"


def kv_namespace(controller_name: str) -> str:
    """GCS key-value namespace of a controller's reservation table."""
    return f"placectl:{controller_name}"


PENDING, READY, DEGRADED, RELEASING = "pending", "ready", "degraded", "releasing"
GROUP_PREFIX = "placectl:"  # + controller name + ":" + job + ":" + token + ":" + slot
_JOB = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
MIN_BUNDLE_CPU = 0.001  # node and hardware bundles need some resource for Ray to pin them


class ReservationError(PlacementError):
    """A reservation request the controller cannot carry out."""


class ReservationTimeout(ReservationError):
    """The cluster could not satisfy a reservation within its timeout."""


class ReservationConflict(ReservationError):
    """The job name is reserved already with a different specification."""


class UnknownReservation(ReservationError):
    """No reservation of that job name exists."""


def check_job(job: object) -> str:
    """Return ``job`` if it is a valid job name, else raise ReservationError."""
    if not isinstance(job, str) or not _JOB.match(job):
        raise ReservationError(
            f"job name {job!r}: use 1-128 letters, digits, '_', '.', '-', starting with a "
            "letter or digit"
        )
    return job


MAX_TIMEOUT_S = 86_400.0


def coerce_spec(spec: Any) -> ClusterSpec:
    """A spec sent to the controller, validated: anything load_spec takes, or a ClusterSpec."""
    if isinstance(spec, ClusterSpec):
        # Re-validate the types of a record that came over the wire.
        try:
            return msgspec.convert(msgspec.to_builtins(spec), ClusterSpec)
        except (msgspec.ValidationError, TypeError) as e:
            raise ReservationError(f"malformed ClusterSpec: {e}") from None
    return load_spec(spec)


def check_timeout(timeout_s: Any) -> float:
    """A reserve timeout in seconds, checked to be a number in (0, MAX_TIMEOUT_S]."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise ReservationError(f"timeout_s {timeout_s!r}: expected a number of seconds")
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise ReservationError(f"timeout_s {timeout_s}: must be in (0, {MAX_TIMEOUT_S:g}]")
    return float(timeout_s)


class BundleRecord(msgspec.Struct, frozen=True):
    """One bundle of a slot's placement group."""

    kind: str  # accelerator | hardware | node
    local_index: int  # planned node-local index (-1 for the node bundle)
    resources: dict[str, float]
    physical_id: int = -1  # probed accelerator id; -1 until probed or for non-accelerators


class SlotRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The placement group of one node used by a job."""

    node_rank: int
    node_id: str
    node_ip: str
    group_name: str
    group_id: str = ""
    bundles: list[BundleRecord] = []

    def bundle_index(self, kind: str, local_index: int) -> int:
        for i, b in enumerate(self.bundles):
            if b.kind == kind and b.local_index == local_index:
                return i
        raise KeyError((kind, local_index))


class ReservationRecord(msgspec.Struct, kw_only=True):
    """A job's reservation as persisted: spec, the cluster it was planned on, slots."""

    job: str
    spec: ClusterSpec
    view: ClusterView
    floating: dict[str, list[int]] = {}
    slots: list[SlotRecord] = []
    state: str = PENDING
    epoch: int = 1
    created_at: float = 0.0
    reason: str = ""  # why the state is what it is (degraded, pending)
    leases: list[PortLease] = []  # master ports first, then ports leased on request

    def master_port(self, component: str) -> int | None:
        for lease in self.leases:
            if lease.component == component and lease.purpose == MASTER:
                return lease.ports[0]
        return None

    def accelerators(self) -> int:
        return sum(1 for s in self.slots for b in s.bundles if b.kind == ACCELERATOR)


class Table(msgspec.Struct, kw_only=True):
    """The whole persisted state: versioned, msgpack-encoded in the GCS KV store."""

    version: int = TABLE_VERSION
    reservations: dict[str, ReservationRecord] = {}


def encode_table(table: Table) -> bytes:
    return msgspec.msgpack.encode(table)


def decode_table(data: bytes | None) -> Table:
    """Decode a stored table; an absent one is empty, another version is an error."""
    if not data:
        return Table()
    version = msgspec.msgpack.decode(data, type=dict[str, Any]).get("version")
    if version != TABLE_VERSION:
        raise ReservationError(
            f"stored reservation table has version {version!r}; this placectl reads "
            f"version {TABLE_VERSION}"
        )
    return msgspec.msgpack.decode(data, type=Table)


class Assignment(msgspec.Struct, kw_only=True, frozen=True):
    """What one process needs to start in its bundle.

    ``placement`` carries the real node id and IP, and physical accelerator ids in
    ``cuda_visible_devices`` / ``local_gpu_id``.
    """

    placement: Placement
    placement_group_id: str
    bundle_index: int
    num_gpus: float
    num_cpus: float
    capture_child_tasks: bool
    env: dict[str, str]
    epoch: int
    resources: dict[str, float] = {}
    python: str | None = None  # the node group's python_interpreter_path, if any

    def actor_options(self) -> dict[str, Any]:
        """Keyword arguments for ``Actor.options(**...)`` that start the process here."""
        from ray.util.placement_group import PlacementGroup
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from controller.raylib import group_handle

        pg: PlacementGroup = group_handle(self.placement_group_id)
        options: dict[str, Any] = {
            "num_gpus": self.num_gpus,
            "num_cpus": self.num_cpus,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=pg,
                placement_group_bundle_index=self.bundle_index,
                placement_group_capture_child_tasks=self.capture_child_tasks,
            ),
            "runtime_env": {"env_vars": dict(self.env)},
        }
        if self.python:
            options["runtime_env"]["py_executable"] = self.python
        if self.resources:
            options["resources"] = dict(self.resources)
        return options


# ---------------------------------------------------------------- plan -> slots
def _floor(x: float) -> float:
    return int(x * GRANULARITY + 1e-9) / GRANULARITY


def plan_slots(cp: ComponentPlacement, name_prefix: str) -> list[SlotRecord]:
    """The slots (one per node the job uses) and their bundles, in node-rank order.

    Slot ``i``'s placement group is named ``f"{name_prefix}{i}"``.
    """
    spec = cp.spec
    used: dict[int, dict[tuple[str, int], dict[str, float]]] = {}
    for name in cp.components:
        pool = cp.pool(name)
        for p in cp.placements(name):
            bundles = used.setdefault(p.node_rank, {})
            if pool.kind == ACCELERATOR:
                for g in p.local_resource_ranks:
                    res = {spec.accelerator: 1.0}
                    if spec.cpus_per_accelerator > 0:
                        res["CPU"] = spec.cpus_per_accelerator
                    bundles[(ACCELERATOR, g)] = res
            elif pool.kind == HARDWARE:
                for u in p.local_resource_ranks:
                    cpu = max(spec.cpus_per_accelerator, MIN_BUNDLE_CPU)
                    bundles[(HARDWARE, u)] = {pool.hardware: 1.0, "CPU": cpu}
            else:
                bundles[(NODE, -1)] = {"CPU": max(spec.cpus_per_accelerator, MIN_BUNDLE_CPU)}
    order = {ACCELERATOR: 0, HARDWARE: 1, NODE: 2}
    slots = []
    for i, nr in enumerate(sorted(used)):
        node = cp.view.nodes[nr]
        keys = sorted(used[nr], key=lambda k: (order[k[0]], k[1]))
        slots.append(
            SlotRecord(
                node_rank=nr,
                node_id=node.node_id,
                node_ip=node.ip,
                group_name=f"{name_prefix}{i}",
                bundles=[BundleRecord(k[0], k[1], used[nr][k]) for k in keys],
            )
        )
    return slots


# ---------------------------------------------------------------- slots -> assignments
def plan_of(res: ReservationRecord) -> ComponentPlacement:
    """Re-plan a reservation: the same spec, cluster view and floating choice give the
    same placements, so any process can rebuild assignments from the stored record."""
    return ComponentPlacement(res.spec, res.view, res.floating)


def build_assignments(
    res: ReservationRecord, cp: ComponentPlacement | None = None
) -> dict[str, list[Assignment]]:
    """Every component's assignments, in rank order, with their environments.

    Args:
        res: a reservation whose slots are created and probed.
        cp: its plan, if already at hand (else re-planned).

    Raises:
        PlacementError: a node group's env_vars set a variable placectl owns.
    """
    cp = plan_of(res) if cp is None else cp
    slot_of = {s.node_rank: s for s in res.slots}
    # processes per node/hardware bundle, for splitting that bundle's CPUs
    sharers: dict[tuple[int, str, int], int] = {}
    for name in cp.components:
        kind = cp.pool(name).kind
        if kind == ACCELERATOR:
            continue
        for p in cp.placements(name):
            key = (p.node_rank, kind, p.local_resource_ranks[0] if kind == HARDWARE else -1)
            sharers[key] = sharers.get(key, 0) + 1

    out: dict[str, list[Assignment]] = {}
    for name in cp.components:
        comp = cp.spec.component(name)
        pool = cp.pool(name)
        master = slot_of[cp.placements(name)[0].node_rank].node_ip
        items = []
        for p in cp.placements(name):
            slot = slot_of[p.node_rank]
            resources: dict[str, float] = {}
            if pool.kind == ACCELERATOR:
                phys = {b.local_index: b.physical_id for b in slot.bundles if b.kind == ACCELERATOR}
                anchor = slot.bundle_index(ACCELERATOR, p.local_resource_ranks[0])
                share = p.accelerator_share
                cpus = _floor(slot.bundles[anchor].resources.get("CPU", 0.0) * share)
                visible = [phys[g] for g in p.cuda_visible_devices]
                placed = msgspec.structs.replace(
                    p,
                    node_id=slot.node_id,
                    node_ip=slot.node_ip,
                    cuda_visible_devices=visible,
                    local_gpu_id=phys[p.local_gpu_id],
                )
                if cp.spec.accelerator == "GPU":
                    gpus = share
                else:
                    gpus, resources = 0.0, {cp.spec.accelerator: share}
            else:
                local = p.local_resource_ranks[0] if pool.kind == HARDWARE else -1
                anchor = slot.bundle_index(pool.kind, local)
                k = sharers[(p.node_rank, pool.kind, local)]
                cpus = _floor(slot.bundles[anchor].resources["CPU"] / k)
                if pool.kind == HARDWARE:
                    resources = {pool.hardware: _floor(1.0 / k)}
                gpus = 0.0
                placed = msgspec.structs.replace(p, node_id=slot.node_id, node_ip=slot.node_ip)
            items.append(
                Assignment(
                    placement=placed,
                    placement_group_id=slot.group_id,
                    bundle_index=anchor,
                    num_gpus=gpus,
                    num_cpus=cpus,
                    capture_child_tasks=comp.capture_child_tasks,
                    env=worker_env(
                        res.spec, res.job, res.epoch, placed, master, res.master_port(name)
                    ),
                    epoch=res.epoch,
                    resources=resources,
                    python=group_env(res.spec, placed.node_group, placed.node_rank)[1],
                )
            )
        out[name] = items
    return out


def describe_difference(old: ClusterSpec, new: ClusterSpec) -> str:
    """A short account of how two specs differ, e.g. ``components[actor].placement: ...``."""
    diffs: list[str] = []

    def short(v: Any) -> str:
        text = repr(v)
        return text if len(text) <= 40 else text[:37] + "..."

    def keyed(items: list) -> dict | None:
        if not all(isinstance(x, dict) and (x.get("name") or x.get("label")) for x in items):
            return None
        return {x.get("name") or x.get("label"): x for x in items}

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, list) and isinstance(b, list):
            ka, kb = keyed(a), keyed(b)
            if ka is not None and kb is not None:
                a, b = ka, kb
            elif len(a) == len(b):
                a, b = dict(enumerate(a)), dict(enumerate(b))
        if isinstance(a, dict) and isinstance(b, dict):
            for k in [*a, *(k for k in b if k not in a)]:
                where = f"{path}[{k}]" if isinstance(k, int) or path.endswith("s") else k
                where = f"{path}.{k}" if path and not where.startswith(path) else where
                if k not in b:
                    diffs.append(f"{where} removed")
                elif k not in a:
                    diffs.append(f"{where} added")
                else:
                    walk(a[k], b[k], where)
        elif a != b:
            diffs.append(f"{path}: {short(a)} -> {short(b)}")

    walk(msgspec.to_builtins(old), msgspec.to_builtins(new), "")
    return "; ".join(diffs[:4]) + ("; ..." if len(diffs) > 4 else "") if diffs else "no difference"
