"""The ``cluster:`` configuration: loading, validation and normalisation.

``load_spec`` accepts a path, YAML text, a dict or an OmegaConf ``DictConfig``, with or
without the top-level ``cluster:`` key. The input is decoded into the strict Structs of
:mod:`controller.planning.spec_file` (unknown keys and wrong types are errors that name
the key path), then checked for meaning and normalised into :class:`ClusterSpec`
(:mod:`controller.planning.spec_model`).
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from controller.errors import SpecError
from controller.planning.documents import convert, read_document
from controller.planning.ranks import parse_placement
from controller.planning.spec_file import RLINF_UNUSED, _Cluster, _Component
from controller.planning.spec_groups import (
    _NAME,
    RESOURCE_NAME,
    check_hardware_per_node,
    check_int,
    node_group,
)
from controller.planning.spec_model import (
    COLLECTIVE_COMPONENTS,
    ENGINES,
    ON_LOSS,
    RANK_LOSS,
    RESERVED_GROUPS,
    WITHIN,
    ClusterSpec,
    ComponentSpec,
    EnvConfig,
    NodeGroup,
    PortRange,
    SegmentRule,
)

__all__ = [
    "ENGINES",
    "RESERVED_GROUPS",
    "ClusterSpec",
    "ComponentSpec",
    "EnvConfig",
    "NodeGroup",
    "PortRange",
    "load_spec",
]

log = logging.getLogger("placectl")
# Bounds on what one configuration may ask for, so hostile input cannot exhaust anything.
MAX_COMPONENTS = 256
MAX_NODE_GROUPS = 256
MAX_NODES = 100_000
MAX_SPARES = 64  # nodes held idle for repairs: more is a second reservation, not spares
_SAID: set[str] = set()


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


def _segment_rule(comp: _Component, where: str) -> SegmentRule | None:
    """Check a component's ``topology`` key."""
    t = comp.topology
    if t is None:
        return None
    if isinstance(t.segment, bool) or t.segment < 1:
        raise SpecError(f"{where}.topology.segment {t.segment!r}: expected an int >= 1")
    if t.within not in WITHIN:
        raise SpecError(
            f"{where}.topology.within {t.within!r}: expected one of {', '.join(WITHIN)}"
        )
    if t.on_loss not in ON_LOSS:
        raise SpecError(
            f"{where}.topology.on_loss {t.on_loss!r}: expected one of {', '.join(ON_LOSS)}"
        )
    return SegmentRule(segment=t.segment, within=t.within, on_loss=t.on_loss)


def _rank_loss(comp: _Component, name: str, names: list[str], where: str) -> str:
    """Check a component's ``on_loss``: ``continue`` only where each rank works alone."""
    if comp.on_loss not in RANK_LOSS:
        raise SpecError(f"{where}.on_loss {comp.on_loss!r}: expected one of {', '.join(RANK_LOSS)}")
    if comp.on_loss != "continue":
        if comp.take_spares:
            raise SpecError(
                f"{where}.take_spares: only with on_loss: continue (got on_loss "
                f"{comp.on_loss!r}: its lost ranks are relaunched, on a held spare first)"
            )
        return comp.on_loss
    if name in COLLECTIVE_COMPONENTS:
        raise SpecError(
            f"{where}.on_loss continue: {name!r} is a trainer whose ranks form one collective "
            "(a lost rank breaks every other rank's step); continue is for components whose "
            "ranks each work alone (rollout, reward, env)"
        )
    if comp.topology is not None:
        raise SpecError(
            f"{where}.on_loss continue: its topology makes groups of {comp.topology.segment} "
            "ranks that work together (a lost rank breaks its group); drop one or the other"
        )
    return comp.on_loss


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
    if comp.engine is not None and comp.isolate is False:
        raise SpecError(
            f"{where}: engine {comp.engine!r} places its workers on its own accelerators; "
            "isolate: false does not apply"
        )
    capture = bool(comp.capture_child_tasks) or comp.engine is not None
    if comp.child_share is not None and not capture:
        raise SpecError(
            f"{where}.child_share: only an engine's processes start children; set "
            "capture_child_tasks: true or engine: vllm"
        )
    return capture


def _normalise(raw: _Cluster) -> ClusterSpec:
    check_int(raw.num_nodes, "cluster.num_nodes", 1, MAX_NODES)
    if len(raw.node_groups) > MAX_NODE_GROUPS:
        raise SpecError(
            f"cluster.node_groups: {len(raw.node_groups)} groups, more than {MAX_NODE_GROUPS}"
        )
    if len(raw.component_placement) > MAX_COMPONENTS:
        raise SpecError(
            f"cluster.component_placement: {len(raw.component_placement)} entries, more "
            f"than {MAX_COMPONENTS}"
        )
    if not RESOURCE_NAME.match(raw.accelerator):
        raise SpecError(f"cluster.accelerator {raw.accelerator!r}: not a valid Ray resource name")
    if raw.cpus_per_accelerator < 0:
        raise SpecError(f"cluster.cpus_per_accelerator {raw.cpus_per_accelerator}: must be >= 0")
    check_int(raw.ports.low, "cluster.ports.low", 1024, 65535)
    check_int(raw.ports.high, "cluster.ports.high", 1024, 65535)
    if raw.ports.low > raw.ports.high:
        raise SpecError(f"cluster.ports {raw.ports.low}-{raw.ports.high}: low must be <= high")
    if raw.num_gpus_per_node is not None:
        check_int(raw.num_gpus_per_node, "cluster.num_gpus_per_node", 0)
    check_int(raw.spares, "cluster.spares", 0, MAX_SPARES)

    groups = [node_group(g, i, raw.num_nodes) for i, g in enumerate(raw.node_groups)]
    check_hardware_per_node(groups)
    labels = [g.label for g in groups]
    for label in labels:
        if labels.count(label) > 1:
            raise SpecError(f"cluster.node_groups: label {label!r} is defined twice")
    known = {*RESERVED_GROUPS, *labels}

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
                    topology=_segment_rule(comp, where),
                    standby=comp.standby,
                    on_loss=_rank_loss(comp, name, names, where),
                    take_spares=comp.take_spares,
                )
            )
    unused = {k: getattr(raw, k) for k in RLINF_UNUSED if getattr(raw, k) is not None}
    fresh = sorted(set(unused) - _SAID)
    if fresh:
        _SAID.update(fresh)
        log.warning(
            "placectl: cluster keys %s are RLinf's; placectl keeps them in the spec and does "
            "not use them",
            ", ".join(fresh),
        )
    return ClusterSpec(
        num_nodes=raw.num_nodes,
        accelerator=raw.accelerator,
        cpus_per_accelerator=float(raw.cpus_per_accelerator),
        ports=PortRange(raw.ports.low, raw.ports.high),
        node_groups=groups,
        components=components,
        num_gpus_per_node=raw.num_gpus_per_node,
        spares=raw.spares,
        unused=msgspec.to_builtins(unused),
    )
