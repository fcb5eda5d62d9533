"""The normalised ``cluster:`` configuration: the record placectl plans from, compares
for idempotence and persists. Equal meaning gives equal records."""

from __future__ import annotations

from typing import Any

import msgspec

from controller.errors import PlacementError

RESERVED_GROUPS = ("cluster", "node")
ENGINES = ("vllm",)
WITHIN = ("nvlink-domain", "rack")
ON_LOSS = ("wait", "span")
# What a worker group does when a node of the component is lost: relaunch the lost ranks
# before the job goes on (``repair``), or go on with the ranks that answer while the
# replacements start in the background (``continue``: ranks that each work alone).
RANK_LOSS = ("repair", "continue")
# RLinf's components whose ranks form one collective (data, tensor or pipeline parallel
# training, and the Megatron inference of reference log-probs): a rank lost breaks the
# step of every other rank, so running short is refused for them.
COLLECTIVE_COMPONENTS = ("actor", "critic", "inference")


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


class SegmentRule(msgspec.Struct, frozen=True, kw_only=True):
    """Groups of consecutive processes that must share an NVLink domain (or a rack).

    Attributes:
        segment: processes per group: ranks ``[i*segment, (i+1)*segment)`` are one (a
            tensor- or expert-parallel group that spans nodes).
        within: ``nvlink-domain`` or ``rack``.
        on_loss: what repair does when a lost node's domain has no free spare: ``wait``
            (stay degraded, saying why) or ``span`` (take a spare elsewhere).
    """

    segment: int
    within: str = "nvlink-domain"
    on_loss: str = "wait"


class ComponentSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One component. Components written under one key share ``key`` and a strategy.

    Attributes:
        capture_child_tasks: Ray tasks and actors the component's processes start stay
            in the reservation; such a component is an engine (see ``starts_children``).
        accelerator_share: fraction of its first accelerator each process requests.
        isolate: for processes on accelerators, each sees only its own (default; False:
            all the component's accelerators on its node). Processes on hardware units or
            nodes see every accelerator of their node, as RLinf shows them, and the job
            holds those accelerators; ``True`` makes them see none and hold none.
        engine: the inference engine the component runs (``vllm``): its processes get
            that engine's own variables for placing their workers.
        child_share: fraction of an accelerator each child of an engine requests.
        topology: the segments that must each stay within one NVLink domain or rack.
        standby: a worker group of it keeps standby processes running on the
            reservation's held spares (``cluster.spares``), promoted in place of ranks a
            lost node took: a repair starts no process for them. With ``on_loss:
            continue`` a standby is a lost rank's replacement, ready at once: the job
            goes on short and admits it at its next weight push.
        on_loss: ``repair`` (default): a worker group's ``repair()`` relaunches the lost
            ranks before it returns. ``continue``: it returns at once with them, the job
            goes on with the ranks that answer, and the replacements start in the
            background, admitted by the job at its next weight push (``admit()``).
        take_spares: with ``on_loss: continue``: a lost node whose ranks all run short
            is placed on a free node, and when there is none, on a held spare even where
            another component's standbys wait (they end, and the reservation holds a new
            spare once a node is free). Without it such a node waits for a free one and
            leaves the held spares to the standbys: its ranks lose only throughput while
            they wait, where a standby component's next loss would lose its standbys.
    """

    name: str
    key: str
    placement: str
    node_groups: list[str]
    capture_child_tasks: bool = False
    accelerator_share: float | None = None
    isolate: bool | None = None
    engine: str | None = None
    child_share: float | None = None
    topology: SegmentRule | None = None
    standby: bool = False
    on_loss: str = "repair"
    take_spares: bool = False

    @property
    def runs_short(self) -> bool:
        """Its worker groups go on with the ranks that answer when ranks are lost."""
        return self.on_loss == "continue"

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
    # Whole nodes of the slots' kind held by the reservation for its repairs (0: none):
    # a repair takes a held one at once instead of waiting for a free node to place on.
    spares: int = 0
    unused: dict[str, Any] = {}  # RLinf's keys that placectl keeps but does not use

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
