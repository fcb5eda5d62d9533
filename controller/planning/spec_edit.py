"""Edits of a configuration for the common moves of an elastic job, and how two
configurations differ, in a few words for error messages (no Ray)."""

from __future__ import annotations

from typing import Any

import msgspec

from controller.errors import PlacementError, SpecError
from controller.planning.spec_model import ClusterSpec


def with_component(
    spec: ClusterSpec,
    component: str,
    placement: str | None = None,
    node_group: str | list[str] | None = None,
) -> ClusterSpec:
    """``spec`` with one component placed anew: a new placement string (a resize, e.g.
    rollout ``0-7`` -> ``0-15``), other node groups (a move), or both.

    A component written under a shared key (``actor,rollout: 0-7``) gets a key of its
    own; the others keep theirs, and colocation shares follow from where each lands.
    The result is checked in full when it is planned.

    Raises:
        SpecError: an unknown component or node group, or a malformed argument.
    """
    try:
        comp = spec.component(component)
    except PlacementError as e:  # it names the known components
        raise SpecError(str(e)) from None
    if placement is None and node_group is None:
        raise SpecError(f"{component}: give a placement, a node group, or both")
    if placement is not None and (not isinstance(placement, str) or not placement.strip()):
        raise SpecError(f"{component}: placement {placement!r}: expected a placement string")
    groups = comp.node_groups
    if node_group is not None:
        labels = [node_group] if isinstance(node_group, str) else node_group
        if not (isinstance(labels, list) and labels and all(isinstance(g, str) for g in labels)):
            raise SpecError(f"{component}: node group {node_group!r}: expected a label or a list")
        for label in labels:
            try:
                spec.node_group(label)
            except PlacementError as e:
                raise SpecError(f"{component}: {e}") from None
        groups = list(labels)
    new = msgspec.structs.replace(
        comp,
        key=comp.name,
        placement=comp.placement if placement is None else placement.strip(),
        node_groups=groups,
    )
    return msgspec.structs.replace(
        spec, components=[new if c.name == component else c for c in spec.components]
    )


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
