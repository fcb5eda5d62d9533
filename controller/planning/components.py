"""``ComponentPlacement``: a whole ``cluster:`` block planned onto a cluster."""

from __future__ import annotations

import contextlib
import gc
from typing import Any

from controller.errors import PlacementError
from controller.planning.cluster import ClusterView
from controller.planning.colocation import AcceleratorUse, ShareRequest, account
from controller.planning.node_groups import (
    ACCELERATOR,
    NODE,
    ResourcePool,
    choose_floating,
    resolve_pool,
)
from controller.planning.placement import Placement, build_placements
from controller.planning.ranks import expand_placement, parse_placement
from controller.planning.segments import check_segments, floating_blocks
from controller.planning.spec import ClusterSpec, ComponentSpec, NodeGroup, load_spec
from controller.planning.strategies import (
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    PlacementStrategy,
)


@contextlib.contextmanager
def _gc_paused():
    # Planning allocates tens of thousands of small lists and records and frees none of
    # them; the cyclic collector would rescan them repeatedly (half the time at 1024 x 8).
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class ComponentPlacement:
    """Every component of a configuration, placed on a cluster.

    The whole plan is computed and checked when the object is built: if construction
    succeeds, every placement string is valid on this cluster and every accelerator's
    shares fit. Components written under one key (``actor,rollout: 0-7``) share one
    strategy object and get identical placements.

    Args:
        spec: a :class:`ClusterSpec` or anything :func:`load_spec` accepts.
        view: the cluster; it must have at least ``num_nodes`` nodes. The reserved
            groups ``cluster`` and ``node`` span its first ``num_nodes`` nodes.
        floating: node ranks already chosen for floating groups, by label; other
            floating groups take the first matching nodes of ``view``.
        check_topology: refuse segments that span NVLink domains (see
            :mod:`controller.planning.segments`); off only to learn their shape.

    Raises:
        PlacementError: anything in the configuration that does not fit the cluster.
    """

    def __init__(
        self,
        spec: ClusterSpec | Any,
        view: ClusterView,
        floating: dict[str, list[int]] | None = None,
        check_topology: bool = True,
    ) -> None:
        self.spec = load_spec(spec)
        self.view = view
        self._check_topology = check_topology
        with _gc_paused():
            self._plan(view, floating)

    def _plan(self, view: ClusterView, floating: dict[str, list[int]] | None) -> None:
        if view.num_nodes < self.spec.num_nodes:
            raise PlacementError(
                f"cluster.num_nodes is {self.spec.num_nodes}, but the cluster has "
                f"{view.num_nodes} node{'s' if view.num_nodes != 1 else ''}"
            )
        self._strategies: dict[str, PlacementStrategy] = {}
        self._pools: dict[str, ResourcePool] = {}
        self._procs: dict[str, list[list[int]]] = {}
        by_key: dict[str, list[ComponentSpec]] = {}
        for comp in self.spec.components:
            by_key.setdefault(comp.key, []).append(comp)
        for comps in by_key.values():
            strategy, pool, procs = self._plan_key(comps[0], floating)
            for comp in comps:
                self._strategies[comp.name] = strategy
                self._pools[comp.name] = pool
                self._procs[comp.name] = procs

        # Only processes on accelerators share them; in a mixed pool, only those ranks.
        accel_ranks: dict[str, list[int]] = {}
        requests = []
        for c in self.spec.components:
            pool, procs = self._pools[c.name], self._procs[c.name]
            kinds = pool.unit_kind or [pool.kind] * pool.size
            ranks = [r for r, units in enumerate(procs) if kinds[units[0]] == ACCELERATOR]
            if not ranks:
                continue
            accel_ranks[c.name] = ranks
            requests.append(
                ShareRequest(
                    c.name,
                    pool.unit_node,
                    pool.unit_local,
                    [procs[r] for r in ranks],
                    c.accelerator_share,
                    c.starts_children,
                    c.child_share,
                )
            )
        shares, self._uses = account(requests)
        share_of: dict[str, tuple[list[float], list[float]]] = {}
        for req, got in zip(requests, shares, strict=True):
            world = len(self._procs[req.component])
            own, kids = [0.0] * world, [0.0] * world
            for i, r in enumerate(accel_ranks[req.component]):
                own[r], kids[r] = got.process[i], got.child[i]
            share_of[req.component] = (own, kids)
        self._placements: dict[str, list[Placement]] = {}
        for comp in self.spec.components:
            own, kids = share_of.get(comp.name, (None, None))
            self._placements[comp.name] = build_placements(
                self._pools[comp.name],
                view,
                self._procs[comp.name],
                component=comp.name,
                isolate=comp.isolate is not False,
                shares=own,
                child_shares=kids,
                node_accelerators=comp.isolate is not True,
            )
            if comp.topology is not None and self._check_topology:
                check_segments(comp.name, comp.topology, self._placements[comp.name], view)

    def _plan_key(self, comp: ComponentSpec, floating: dict[str, list[int]] | None):
        groups = [self.spec.node_group(label) for label in comp.node_groups]
        what = f"cluster.component_placement.{comp.key}"
        segments = parse_placement(comp.placement, what)
        pool = resolve_pool(groups, self.view, self.spec.num_nodes, floating)
        procs = expand_placement(segments, pool.unit_node, comp.placement, what, pool.noun())
        if pool.kind == NODE:
            strategy: PlacementStrategy = NodePlacementStrategy(
                [units[0] for units in procs], node_group=groups
            )
        else:
            strategy = FlexiblePlacementStrategy.from_plan(procs, groups)
        return strategy.bind(self.spec.num_nodes, floating), pool, procs

    @property
    def components(self) -> list[str]:
        """Component names in configuration order."""
        return [c.name for c in self.spec.components]

    def _check(self, component: str) -> None:
        if component not in self._placements:
            raise PlacementError(
                f"unknown component {component!r}; the configuration has "
                f"{', '.join(self.components) or 'none'}"
            )

    def world_size(self, component: str) -> int:
        """Number of processes of ``component``."""
        self._check(component)
        return len(self._placements[component])

    def get_strategy(self, component: str) -> PlacementStrategy:
        """The strategy of ``component``; components under one key share it."""
        self._check(component)
        return self._strategies[component]

    def placements(self, component: str) -> list[Placement]:
        """Placements of ``component``, ordered by rank."""
        self._check(component)
        return self._placements[component]

    def pool(self, component: str) -> ResourcePool:
        """The ranked resources ``component`` chose from."""
        self._check(component)
        return self._pools[component]

    def accelerator_uses(self) -> list[AcceleratorUse]:
        """Every accelerator in use: which processes share it and the share of each."""
        return list(self._uses)

    def to_dict(self) -> dict[str, Any]:
        """``{"components": {name: [placement as dict, ...]}}``, as ``plan --json`` prints."""
        import msgspec

        return {
            "components": {
                name: msgspec.to_builtins(self._placements[name]) for name in self.components
            }
        }


def choose_floating_nodes(
    spec: ClusterSpec,
    view: ClusterView,
    groups: list[NodeGroup],
    free: dict[str, dict[str, float]],
    kept: dict[str, list[int]] | None = None,
) -> dict[str, list[int]]:
    """Nodes for the floating ``groups`` (those in ``kept`` stay where they are). A group
    holding a segmented component takes whole blocks of one domain at a time, so that
    the plan's segment check holds where the free nodes allow it."""
    floating = dict(kept or {})
    floating.update(choose_floating(groups, view, free, spec.accelerator))
    if any(c.topology is not None for c in spec.components):
        trial = ComponentPlacement(spec, view, floating, check_topology=False)
        labels = {g.label for g in groups}
        blocks = {k: v for k, v in floating_blocks(trial).items() if k in labels}
        if blocks:
            floating.update(choose_floating(groups, view, free, spec.accelerator, blocks))
    return floating
