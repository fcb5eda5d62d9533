"""Edits of a configuration for the common moves of an elastic job (no Ray)."""

from __future__ import annotations

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
