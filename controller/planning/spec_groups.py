"""Node groups of a ``cluster:`` block: their nodes, hardware and environment, checked
for meaning (RLinf's rules included) and normalised."""

from __future__ import annotations

import re
from typing import Any

from controller.errors import SpecError
from controller.planning.hardware import hardware_units
from controller.planning.ranks import parse_rank_list
from controller.planning.spec_file import _NodeGroup
from controller.planning.spec_model import RESERVED_GROUPS, EnvConfig, NodeGroup

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESOURCE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-./]*$")


def check_int(value: int, where: str, low: int, high: int | None = None) -> None:
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


def node_group(raw: _NodeGroup, i: int, num_nodes: int) -> NodeGroup:
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
        check_int(raw.count, f"{where}.count", 1)
        node_ranks = None
    else:
        if raw.node_ranks is None:
            raise SpecError(f"{where}.node_ranks: required key is missing")
        node_ranks = parse_rank_list(raw.node_ranks, f"{where}.node_ranks", upper=num_nodes)
        node_ranks = sorted(range(num_nodes) if node_ranks is None else node_ranks)
    hardware = units = None
    if raw.hardware is not None:
        if raw.ignore_hardware:
            raise SpecError(
                f"{where}: ignore_hardware makes the group's resources its nodes; it cannot "
                "also declare hardware"
            )
        hardware = raw.hardware.type
        if not RESOURCE_NAME.match(hardware):
            raise SpecError(f"{where}.hardware.type {hardware!r}: not a valid Ray resource name")
        units = hardware_units(hardware, raw.hardware.configs, node_ranks, f"{where}.hardware")
    return NodeGroup(
        label=label,
        node_ranks=node_ranks,
        hardware=hardware,
        hardware_units=units,
        nodes_only=raw.ignore_hardware,
        selector=dict(raw.selector) if floating else None,
        count=raw.count or 0,
        env_configs=_env_configs(raw, where, label, node_ranks, num_nodes),
    )


def _env_configs(
    raw: _NodeGroup, where: str, label: str, node_ranks: list[int] | None, num_nodes: int
) -> list[EnvConfig]:
    """A group's env_configs; as in RLinf, entries may not share a node or a variable."""
    out: list[EnvConfig] = []
    covered: dict[int, int] = {}
    keys: dict[str, int] = {}
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
        for r in ranks if ranks is not None else (node_ranks or [-1]):
            if r in covered:
                raise SpecError(
                    f"{ewhere}.node_ranks: node {r} is in env_configs[{covered[r]}] already; "
                    "each node of a group takes its environment from one entry"
                )
            covered[r] = j
        env_vars = _env_vars(env.env_vars, f"{ewhere}.env_vars")
        for name in env_vars:
            if name in keys:
                raise SpecError(
                    f"{ewhere}.env_vars: {name} is set in env_configs[{keys[name]}] of group "
                    f"{label!r} already; set each variable once per group"
                )
            keys[name] = j
        out.append(
            EnvConfig(
                node_ranks=sorted(ranks) if ranks is not None else None,
                env_vars=env_vars,
                python_interpreter_path=env.python_interpreter_path,
            )
        )
    return out


def check_hardware_per_node(groups: list[NodeGroup]) -> None:
    """As in RLinf, one kind of hardware on one node is declared by one group only.

    Raises:
        SpecError: two groups declare the same hardware on the same node.
    """
    owner: dict[tuple[int, str], str] = {}
    for g in groups:
        if g.hardware is None:
            continue
        ranks = sorted(g.hardware_units) if g.hardware_units is not None else g.node_ranks or []
        for r in ranks:
            key = (r, g.hardware.lower())
            if key in owner and owner[key] != g.label:
                raise SpecError(
                    f"cluster.node_groups: {owner[key]!r} and {g.label!r} both declare "
                    f"{g.hardware} hardware on node {r}; declare it in one group"
                )
            owner[key] = g.label
