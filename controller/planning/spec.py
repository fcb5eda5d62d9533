"""The ``cluster:`` configuration: loading, validation and its normalised form.

``load_spec`` accepts a path, YAML text, a dict or an OmegaConf ``DictConfig``, with or
without the top-level ``cluster:`` key. The input is decoded into strict msgspec Structs
(unknown keys and wrong types are errors that name the key path), then checked for
meaning and normalised into :class:`ClusterSpec`: the record placectl plans from,
compares for idempotence and persists.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from controller.errors import PlacementError, SpecError
from controller.planning.documents import convert, read_document
from controller.planning.ranks import parse_placement, parse_rank_list

RESERVED_GROUPS = ("cluster", "node")
ENGINES = ("vllm",)
# Bounds on what one configuration may ask for, so hostile input cannot exhaust anything.
MAX_COMPONENTS = 256
MAX_NODE_GROUPS = 256
MAX_NODES = 100_000
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESOURCE = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-./]*$")


# ---------------------------------------------------------------- the file as written
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
    configs: list[dict[str, Any]] = []


class _NodeGroup(_Strict):
    label: str | int
    node_ranks: int | str | None = None
    env_configs: list[_EnvConfig] = []
    hardware: _Hardware | None = None
    selector: dict[str, str] | None = None
    count: int | None = None


class _Component(_Strict):
    placement: int | str
    node_group: str | int | list[str | int] | None = None
    capture_child_tasks: bool | None = None
    accelerator_share: float | None = None
    isolate: bool = True
    engine: str | None = None
    child_share: float | None = None


class _Cluster(_Strict):
    num_nodes: int
    component_placement: dict[str, Any]
    accelerator: str = "GPU"
    cpus_per_accelerator: float = 1.0
    ports: _Ports = msgspec.field(default_factory=_Ports)
    node_groups: list[_NodeGroup] = []
    num_gpus_per_node: int | None = None  # RLinf's older key; the dry run's default


# ---------------------------------------------------------------- the normalised form
class PortRange(msgspec.Struct, frozen=True):
    """Inclusive range master ports are leased from."""

    low: int = 20000
    high: int = 29999


class EnvConfig(msgspec.Struct, frozen=True):
    """Environment of some nodes of a group; ``node_ranks`` None means all of them."""

    node_ranks: list[int] | None
    env_vars: dict[str, str]
    python_interpreter_path: str | None = None


class NodeGroup(msgspec.Struct, frozen=True, kw_only=True):
    """A labelled set of nodes.

    Attributes:
        label: the group's name.
        node_ranks: cluster node ranks in node-rank order; ``None`` for the reserved
            ``cluster``/``node`` groups (every node) and for floating groups.
        hardware: the Ray resource whose units are this group's resources, if any.
        hardware_units: units per node rank, from ``hardware.configs``; when ``None``
            the units come from the cluster's resources.
        nodes_only: the group's resources are its nodes even where it has accelerators.
        selector, count: a floating group: ``count`` nodes whose labels match.
        env_configs: per-node environment, RLinf form.
    """

    label: str
    node_ranks: list[int] | None = None
    hardware: str | None = None
    hardware_units: dict[int, int] | None = None
    nodes_only: bool = False
    selector: dict[str, str] | None = None
    count: int = 0
    env_configs: list[EnvConfig] = []

    @property
    def floating(self) -> bool:
        return self.selector is not None


class ComponentSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One component. Components written under one key share ``key`` and a strategy.

    Attributes:
        capture_child_tasks: Ray tasks and actors the component's processes start stay
            in the reservation; such a component is an engine (see ``starts_children``).
        accelerator_share: fraction of its first accelerator each process requests.
        isolate: each process sees only its own accelerators (else all the
            component's accelerators on its node).
        engine: the inference engine the component runs (``vllm``): its processes get
            that engine's own variables for placing their workers.
        child_share: fraction of an accelerator each child of an engine requests.
    """

    name: str
    key: str
    placement: str
    node_groups: list[str]
    capture_child_tasks: bool = False
    accelerator_share: float | None = None
    isolate: bool = True
    engine: str | None = None
    child_share: float | None = None

    @property
    def starts_children(self) -> bool:
        """An engine: each process may start one child per accelerator it holds."""
        return self.capture_child_tasks or self.engine is not None


class ClusterSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A validated, normalised ``cluster:`` block. Equal meaning gives equal records."""

    num_nodes: int
    accelerator: str = "GPU"
    cpus_per_accelerator: float = 1.0
    ports: PortRange = PortRange()
    node_groups: list[NodeGroup] = []
    components: list[ComponentSpec] = []
    num_gpus_per_node: int | None = None

    def component(self, name: str) -> ComponentSpec:
        for c in self.components:
            if c.name == name:
                return c
        raise PlacementError(
            f"unknown component {name!r}; the configuration has "
            f"{', '.join(c.name for c in self.components)}"
        )

    def node_group(self, label: str) -> NodeGroup:
        if label == "cluster":
            return NodeGroup(label="cluster")
        if label == "node":
            return NodeGroup(label="node", nodes_only=True)
        for g in self.node_groups:
            if g.label == label:
                return g
        known = [*RESERVED_GROUPS, *(g.label for g in self.node_groups)]
        raise PlacementError(f"unknown node group {label!r}; known groups: {', '.join(known)}")


# ---------------------------------------------------------------- loading
def load_spec(source: Any) -> ClusterSpec:
    """Load and validate a ``cluster:`` block.

    Args:
        source: a path, YAML text, a dict, or an OmegaConf ``DictConfig``; either a
            whole document with a top-level ``cluster:`` key or the block itself.
            A ``ClusterSpec`` is returned unchanged.

    Returns:
        The normalised, validated specification.

    Raises:
        SpecError: unreadable input, an unknown key, a wrong type or a missing key; the
            message names the key path, e.g. ``cluster.node_groups[1].node_ranks``.
        PlacementError: a value that breaks a rule (a rank out of range, an unknown
            node group, a malformed placement string).
    """
    if isinstance(source, ClusterSpec):
        return source
    data = read_document(source)
    if isinstance(data, dict) and "cluster" in data:
        data = data["cluster"]
    if not isinstance(data, dict):
        raise SpecError(
            f"cluster: expected a mapping with num_nodes and component_placement, "
            f"got {type(data).__name__}"
        )
    return _normalise(convert(data, _Cluster, "cluster"))


# ---------------------------------------------------------------- meaning
def _check_int(value: int, where: str, low: int, high: int | None = None) -> None:
    if value < low or (high is not None and value > high):
        allowed = f">= {low}" if high is None else f"{low}-{high}"
        raise SpecError(f"{where} {value}: must be {allowed}")


def _env_vars(raw: list[dict[str, Any]] | dict[str, Any], where: str) -> dict[str, str]:
    pairs: list[tuple[Any, Any]] = []
    for i, item in enumerate([raw] if isinstance(raw, dict) else raw):
        if isinstance(raw, list) and len(item) != 1:
            raise SpecError(f"{where}[{i}]: each entry maps one name to one value, got {item!r}")
        pairs.extend(item.items())
    out: dict[str, str] = {}
    for name, value in pairs:
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise SpecError(f"{where}: {name!r} is not a valid environment variable name")
        if isinstance(value, (dict, list)) or value is None:
            raise SpecError(f"{where}.{name}: expected a string or number, got {value!r}")
        out[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def _hardware_units(hw: _Hardware, node_ranks: list[int] | None, where: str):
    if not hw.configs:
        return None
    units: dict[int, int] = {}
    for i, cfg in enumerate(hw.configs):
        rank = cfg.get("node_rank")
        if rank is None:
            if node_ranks is None or len(node_ranks) != 1:
                return None  # units then come from the cluster's resources
            rank = node_ranks[0]
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise SpecError(f"{where}.configs[{i}].node_rank {rank!r}: expected an int")
        if node_ranks is not None and rank not in node_ranks:
            raise SpecError(
                f"{where}.configs[{i}].node_rank {rank}: not a node of the group "
                f"(its nodes: {node_ranks})"
            )
        units[rank] = units.get(rank, 0) + 1
    return units


def _node_group(raw: _NodeGroup, i: int, num_nodes: int) -> NodeGroup:
    where = f"cluster.node_groups[{i}]"
    label = str(raw.label)
    if not label or not _NAME.match(label):
        raise SpecError(f"{where}.label {label!r}: use letters, digits, '_', '.', '-'")
    if label in RESERVED_GROUPS:
        raise SpecError(f"{where}.label {label!r}: 'cluster' and 'node' are reserved labels")
    floating = raw.selector is not None or raw.count is not None
    if floating:
        if raw.node_ranks is not None:
            raise SpecError(f"{where}: give either node_ranks or selector with count, not both")
        if not raw.selector or raw.count is None:
            raise SpecError(f"{where}: a floating group needs both a non-empty selector and count")
        _check_int(raw.count, f"{where}.count", 1)
        node_ranks = None
    else:
        if raw.node_ranks is None:
            raise SpecError(f"{where}.node_ranks: required key is missing")
        node_ranks = parse_rank_list(raw.node_ranks, f"{where}.node_ranks", upper=num_nodes)
        node_ranks = sorted(range(num_nodes) if node_ranks is None else node_ranks)
    hardware = units = None
    if raw.hardware is not None:
        hardware = raw.hardware.type
        if not _RESOURCE.match(hardware):
            raise SpecError(f"{where}.hardware.type {hardware!r}: not a valid Ray resource name")
        units = _hardware_units(raw.hardware, node_ranks, f"{where}.hardware")
    env_configs = []
    for j, env in enumerate(raw.env_configs):
        ewhere = f"{where}.env_configs[{j}]"
        ranks = parse_rank_list(env.node_ranks, f"{ewhere}.node_ranks", upper=num_nodes)
        if ranks is not None:
            if node_ranks is None:
                raise SpecError(f"{ewhere}.node_ranks: a floating group's env_configs use 'all'")
            outside = sorted(set(ranks) - set(node_ranks))
            if outside:
                raise SpecError(
                    f"{ewhere}.node_ranks {env.node_ranks!r}: nodes {outside} are not in "
                    f"group {label!r} (its nodes: {node_ranks})"
                )
        env_configs.append(
            EnvConfig(
                node_ranks=sorted(ranks) if ranks is not None else None,
                env_vars=_env_vars(env.env_vars, f"{ewhere}.env_vars"),
                python_interpreter_path=env.python_interpreter_path,
            )
        )
    return NodeGroup(
        label=label,
        node_ranks=node_ranks,
        hardware=hardware,
        hardware_units=units,
        selector=dict(raw.selector) if floating else None,
        count=raw.count or 0,
        env_configs=env_configs,
    )


def _group_labels(value: str | int | list[str | int] | None, where: str) -> list[str]:
    if value is None:
        return ["cluster"]
    items = value if isinstance(value, list) else str(value).split(",")
    labels = [str(v).strip() for v in items]
    if not labels or any(not label for label in labels):
        raise SpecError(f"{where} {value!r}: empty node group label")
    if len(set(labels)) != len(labels):
        raise SpecError(f"{where} {value!r}: a node group is listed twice")
    return labels


def _engine_keys(comp: _Component, where: str) -> bool:
    """Check the share and engine keys of a component; returns capture_child_tasks."""
    for key in ("accelerator_share", "child_share"):
        share = getattr(comp, key)
        if share is not None and not 0 < share <= 1:
            raise SpecError(f"{where}.{key} {share}: must be in (0, 1]")
    if comp.engine is not None and comp.engine not in ENGINES:
        raise SpecError(
            f"{where}.engine {comp.engine!r}: supported engines are {', '.join(ENGINES)}"
        )
    if comp.engine is not None and comp.capture_child_tasks is False:
        raise SpecError(
            f"{where}: engine {comp.engine!r} places its workers as captured child tasks; "
            "drop capture_child_tasks: false"
        )
    capture = bool(comp.capture_child_tasks) or comp.engine is not None
    if comp.child_share is not None and not capture:
        raise SpecError(
            f"{where}.child_share: only an engine's processes start children; set "
            "capture_child_tasks: true or engine: vllm"
        )
    return capture


def _normalise(raw: _Cluster) -> ClusterSpec:
    _check_int(raw.num_nodes, "cluster.num_nodes", 1, MAX_NODES)
    if len(raw.node_groups) > MAX_NODE_GROUPS:
        raise SpecError(
            f"cluster.node_groups: {len(raw.node_groups)} groups, more than {MAX_NODE_GROUPS}"
        )
    if len(raw.component_placement) > MAX_COMPONENTS:
        raise SpecError(
            f"cluster.component_placement: {len(raw.component_placement)} entries, more "
            f"than {MAX_COMPONENTS}"
        )
    if not _RESOURCE.match(raw.accelerator):
        raise SpecError(f"cluster.accelerator {raw.accelerator!r}: not a valid Ray resource name")
    if raw.cpus_per_accelerator < 0:
        raise SpecError(f"cluster.cpus_per_accelerator {raw.cpus_per_accelerator}: must be >= 0")
    _check_int(raw.ports.low, "cluster.ports.low", 1024, 65535)
    _check_int(raw.ports.high, "cluster.ports.high", 1024, 65535)
    if raw.ports.low > raw.ports.high:
        raise SpecError(f"cluster.ports {raw.ports.low}-{raw.ports.high}: low must be <= high")
    if raw.num_gpus_per_node is not None:
        _check_int(raw.num_gpus_per_node, "cluster.num_gpus_per_node", 0)

    groups = [_node_group(g, i, raw.num_nodes) for i, g in enumerate(raw.node_groups)]
    labels = [g.label for g in groups]
    for label in labels:
        if labels.count(label) > 1:
            raise SpecError(f"cluster.node_groups: label {label!r} is defined twice")
    known = {*RESERVED_GROUPS, *labels}

    if not raw.component_placement:
        raise SpecError("cluster.component_placement: at least one component is required")
    components: list[ComponentSpec] = []
    seen: dict[str, str] = {}
    for key, value in raw.component_placement.items():
        where = f"cluster.component_placement.{key}"
        names = [n.strip() for n in key.split(",")]
        if len(seen) + len(names) > MAX_COMPONENTS:
            raise SpecError(f"cluster.component_placement: more than {MAX_COMPONENTS} components")
        for name in names:
            if not _NAME.match(name):
                raise SpecError(
                    f"cluster.component_placement key {key!r}: component name {name!r} must "
                    "use letters, digits, '_', '.', '-'"
                )
            if name in seen:
                raise SpecError(
                    f"cluster.component_placement: component {name!r} appears under both "
                    f"{seen[name]!r} and {key!r}"
                )
            seen[name] = key
        value = convert(value, int | str | _Component, where)
        comp = value if isinstance(value, _Component) else _Component(placement=value)
        placement_where = f"{where}.placement" if isinstance(value, _Component) else where
        parse_placement(comp.placement, placement_where)  # syntax errors surface at load
        group_labels = _group_labels(comp.node_group, f"{where}.node_group")
        for label in group_labels:
            if label not in known:
                raise SpecError(
                    f"{where}.node_group: unknown node group {label!r}; known groups: "
                    f"{', '.join(sorted(known))}"
                )
        capture = _engine_keys(comp, where)
        for name in names:
            components.append(
                ComponentSpec(
                    name=name,
                    key=key,
                    placement=str(comp.placement),
                    node_groups=group_labels,
                    capture_child_tasks=capture,
                    accelerator_share=comp.accelerator_share,
                    isolate=comp.isolate,
                    engine=comp.engine,
                    child_share=comp.child_share,
                )
            )
    return ClusterSpec(
        num_nodes=raw.num_nodes,
        accelerator=raw.accelerator,
        cpus_per_accelerator=float(raw.cpus_per_accelerator),
        ports=PortRange(raw.ports.low, raw.ports.high),
        node_groups=groups,
        components=components,
        num_gpus_per_node=raw.num_gpus_per_node,
    )
