"""Node order on clusters whose nodes state their NVLink domain, rack and topology rank.
No Ray."""

from __future__ import annotations

import random

import pytest

from controller.planning.cluster import NODE_RANK_LABEL, NodeView, order_nodes
from controller.planning.topology import (
    GPU_DOMAIN_LABEL,
    RACK_LABEL,
    TOPO_RANK_LABEL,
    Topology,
    topology_of,
    topology_problems,
)
from controller.state.spares import choose_spare, is_replacement


def nvl72_cluster() -> list[NodeView]:
    """A CPU head, two NVL72-style domains of 18 four-GPU nodes (domain A by Ray's label,
    domain B by NeMo-RL's resource, B earlier in topology rank) and a plain rack of 4,
    with IPs that interleave all of them."""
    ips = [f"10.0.{i % 7}.{i}" for i in range(1, 41)]
    random.Random(3).shuffle(ips)
    nodes = [NodeView(num_gpus=0, node_id="head", ip="10.0.9.1", is_head=True)]
    for k in range(18):
        nodes.append(
            NodeView(
                num_gpus=4,
                node_id=f"a{k:02d}",
                ip=ips[k],
                labels={GPU_DOMAIN_LABEL: "A", TOPO_RANK_LABEL: str(100 + k)},
            )
        )
        nodes.append(
            NodeView(
                num_gpus=4,
                node_id=f"b{k:02d}",
                ip=ips[18 + k],
                resources={"nvlink_domain_B": 1.0, "topo_rank": float(1 + k)},
            )
        )
    for k in range(4):
        nodes.append(
            NodeView(num_gpus=8, node_id=f"r{k}", ip=ips[36 + k], labels={RACK_LABEL: "r9"})
        )
    return nodes


def test_each_domain_holds_consecutive_node_ranks_in_topology_order():
    ordered = order_nodes(nvl72_cluster())
    ids = [n.node_id for n in ordered]
    assert ids[:18] == [f"b{k:02d}" for k in range(18)]  # B's lowest topology rank is 1
    assert ids[18:36] == [f"a{k:02d}" for k in range(18)]
    plain = ordered[36:40]
    assert [n.node_id for n in plain] == [
        n.node_id for n in sorted(plain, key=lambda n: tuple(map(int, n.ip.split("."))))
    ]
    assert ids[40] == "head"  # no domain and no rack: after every domain and rack


def test_the_order_depends_only_on_the_nodes():
    nodes = nvl72_cluster()
    expected = [n.node_id for n in order_nodes(nodes)]
    for seed in range(5):
        shuffled = list(nodes)
        random.Random(seed).shuffle(shuffled)
        assert [n.node_id for n in order_nodes(shuffled)] == expected


def test_without_topology_the_order_is_head_then_ip():
    nodes = [
        NodeView(num_gpus=4, node_id="x", ip="10.0.0.10"),
        NodeView(num_gpus=4, node_id="y", ip="10.0.0.9"),
        NodeView(num_gpus=0, node_id="h", ip="10.0.0.50", is_head=True),
    ]
    assert [n.node_id for n in order_nodes(nodes)] == ["h", "y", "x"]


def test_the_node_rank_label_wins_over_topology():
    nodes = nvl72_cluster()
    labelled = [
        NodeView(
            num_gpus=n.num_gpus,
            node_id=n.node_id,
            ip=n.ip,
            resources=n.resources,
            labels={**n.labels, NODE_RANK_LABEL: str(len(nodes) - i)},
        )
        for i, n in enumerate(nodes)
    ]
    assert [n.node_id for n in order_nodes(labelled)] == [n.node_id for n in reversed(nodes)]


def test_racks_within_a_domain_are_consecutive():
    nodes = [
        NodeView(num_gpus=4, node_id=f"n{i}", ip=f"10.0.0.{i}", labels=labels)
        for i, labels in enumerate(
            [
                {GPU_DOMAIN_LABEL: "d", RACK_LABEL: "r2"},
                {GPU_DOMAIN_LABEL: "d", RACK_LABEL: "r1"},
                {GPU_DOMAIN_LABEL: "d", RACK_LABEL: "r2"},
                {GPU_DOMAIN_LABEL: "d", RACK_LABEL: "r1"},
            ],
            start=1,
        )
    ]
    # r2 holds the first node by IP, so it comes first; each rack's nodes together
    assert [n.node_id for n in order_nodes(nodes)] == ["n1", "n3", "n2", "n4"]


@pytest.mark.parametrize(
    ("labels", "resources", "expected"),
    [
        (
            {GPU_DOMAIN_LABEL: "x"},
            {"nvlink_domain_y": 1.0},
            Topology(domain="x", source=GPU_DOMAIN_LABEL),
        ),
        ({}, {"nvlink_domain_y": 1.0}, Topology(domain="y", source="nvlink_domain_y")),
        ({TOPO_RANK_LABEL: "7"}, {"topo_rank": 3.0}, Topology(topo_rank=7)),
        ({}, {"topo_rank": 3.0}, Topology(topo_rank=3)),
        ({RACK_LABEL: "r"}, {}, Topology(rack="r")),
        ({}, {}, Topology()),
    ],
)
def test_where_a_node_states_its_topology(labels, resources, expected):
    assert topology_of(labels, resources) == expected


def test_unreadable_topology_is_ignored_and_named():
    labels = {TOPO_RANK_LABEL: "third", GPU_DOMAIN_LABEL: "d"}
    resources = {"nvlink_domain_a": 1.0, "nvlink_domain_b": 1.0}
    assert topology_of(labels, resources) == Topology(domain="d", source=GPU_DOMAIN_LABEL)
    problems = topology_problems(labels, resources)
    assert any("'third' is not an int" in p for p in problems)
    assert any("several NVLink domain resources" in p for p in problems)
    # a node with such labels still orders
    node = NodeView(num_gpus=1, node_id="n", ip="10.0.0.1", labels=labels, resources=resources)
    assert order_nodes([node]) == [node]


def _spare_for(dead: NodeView, candidates: list[NodeView]) -> str | None:
    free = {n.node_id: {"GPU": 4.0} for n in candidates}
    found = choose_spare(dead, order_nodes(candidates), free, {"GPU": 4.0}, set())
    return found.node_id if found else None


def test_a_lost_node_is_replaced_from_its_own_domain_then_its_rack():
    nodes = nvl72_cluster()
    a, b = nodes[1], nodes[2]  # a00 (domain A, by label), b00 (domain B, by resource)
    spares = [n for n in nodes if n.node_id in ("a05", "b07", "b03")]
    # b07 and b03 precede a05 in node order (B first); A's node is still chosen for A
    assert _spare_for(a, spares) == "a05"
    assert _spare_for(b, spares) == "b03"  # same domain: the first in node order
    # no free node of its domain: another of the same kind, rather than none
    assert _spare_for(a, [n for n in spares if n.node_id != "a05"]) == "b03"
    racked = [
        NodeView(num_gpus=4, node_id=f"n{i}", ip=f"10.0.0.{i}", labels=labels)
        for i, labels in enumerate(
            [
                {GPU_DOMAIN_LABEL: "d", RACK_LABEL: "r1"},
                {GPU_DOMAIN_LABEL: "e", RACK_LABEL: "r2"},
                {GPU_DOMAIN_LABEL: "d", RACK_LABEL: "r2"},
                {GPU_DOMAIN_LABEL: "d", RACK_LABEL: "r1"},
            ]
        )
    ]
    assert _spare_for(racked[3], racked[:3]) == "n0"  # same domain and rack
    assert _spare_for(racked[3], racked[1:3]) == "n2"  # same domain, other rack
    assert _spare_for(racked[3], racked[1:2]) == "n1"  # other domain


def test_topology_labels_and_resources_do_not_make_nodes_different_kinds():
    nodes = nvl72_cluster()
    a00, b00, a01 = nodes[1], nodes[2], nodes[3]
    assert is_replacement(a00, a01)  # different topology ranks
    assert is_replacement(a00, b00)  # label vs NeMo-RL's per-node resources
    assert not is_replacement(a00, nodes[-1])  # 8 GPUs: another kind
