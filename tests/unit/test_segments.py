"""Segments that must stay within one NVLink domain: the plan's refusals, and repair on the
fake cluster (a lost node's segment waits for a spare of its own domain, or spans when
allowed). Milliseconds each; observations go through the stored table."""

from __future__ import annotations

import re

import pytest

from clients.testing.fake_cluster import FakeCluster
from controller import ClusterView, ComponentPlacement, NodeView, PlacementError, load_spec
from controller.planning.cluster import order_nodes
from controller.planning.components import choose_floating_nodes
from controller.planning.topology import GPU_DOMAIN_LABEL
from tests.unit.fakes import controller, run, stored, until


def domains(a: int, b: int) -> ClusterView:
    """``a`` nodes of domain A and ``b`` of B, 4 GPUs each, IPs interleaved."""
    nodes = [
        NodeView(
            num_gpus=4,
            node_id=f"{d}{i}",
            ip=f"10.0.0.{2 * i + (d == 'B')}",
            labels={GPU_DOMAIN_LABEL: d},
        )
        for d, n in (("A", a), ("B", b))
        for i in range(n)
    ]
    return ClusterView(nodes=order_nodes(nodes))


def actor(placement: str, segment: int = 8, **rule) -> dict:
    return {
        "num_nodes": 6,
        "component_placement": {
            "actor": {"placement": placement, "topology": {"segment": segment, **rule}}
        },
    }


def test_segments_within_one_domain_plan():
    cp = ComponentPlacement(load_spec(actor("0-7,12-19")), domains(3, 3))
    nodes = [cp.view.nodes[p.node_rank].labels[GPU_DOMAIN_LABEL] for p in cp.placements("actor")]
    assert nodes == ["A"] * 8 + ["B"] * 8


@pytest.mark.parametrize(
    ("placement", "segment", "message"),
    [
        ("0-15", 8, "processes 8-15 (topology.segment 8) span NVLink domains A (node rank 2), B"),
        ("0-11", 8, "does not divide its 12 processes (allowed: 1, 2, 3, 4, 6, 12)"),
    ],
)
def test_a_segment_that_cannot_stay_whole_is_refused(placement, segment, message):
    with pytest.raises(PlacementError, match=re.escape(message)):
        ComponentPlacement(load_spec(actor(placement, segment)), domains(3, 3))


def test_nodes_that_state_no_domain_are_named():
    no_domain = re.escape("node rank(s) 0-1, which state no NVLink domain")
    with pytest.raises(PlacementError, match=no_domain):
        ComponentPlacement(load_spec(actor("0-7")), ClusterView.uniform(6, 4))
    rack = {
        "num_nodes": 6,
        "component_placement": {
            "x": {"placement": "0-7", "topology": {"segment": 4, "within": "rack"}}
        },
    }
    with pytest.raises(
        PlacementError, match=re.escape("state no rack; give every node the label placectl.io/rack")
    ):
        ComponentPlacement(load_spec(rack), domains(3, 3))


def _fake(a: int, b: int) -> tuple[FakeCluster, dict[str, str]]:
    fake = FakeCluster()
    fake.add_node(num_gpus=0, num_cpus=2, head=True, ip="10.0.1.1")
    domain_of = {}
    for d, n in (("A", a), ("B", b)):
        for i in range(n):
            nid = fake.add_node(
                num_gpus=4,
                num_cpus=4,
                labels={GPU_DOMAIN_LABEL: d, "pool": "h"},
                ip=f"10.0.0.{2 * i + (d == 'B')}",
            )
            domain_of[nid] = d
    return fake, domain_of


def _domains_of(fake, domain_of, job):
    return [domain_of.get(s.node_id) for s in stored(fake, job).slots]


def test_a_lost_nodes_segment_waits_for_a_spare_of_its_domain():
    async def go():
        fake, domain_of = _fake(3, 2)
        ctl = await controller(fake)
        spec = {**actor("0-7"), "num_nodes": 6}
        await ctl.reserve("tp", spec, 5)
        assert _domains_of(fake, domain_of, "tp") == ["A", "A"]
        # A's third node is taken by another job; B's two are free, of the same kind
        await ctl.reserve("other", {"num_nodes": 6, "component_placement": {"x": "8-11"}}, 5)
        assert _domains_of(fake, domain_of, "other") == ["A"]
        fake.kill_node(stored(fake, "tp").slots[0].node_id)
        rec = await until(
            lambda: "NVLink domain A" in stored(fake, "tp").reason and stored(fake, "tp")
        )
        assert rec.state == "degraded" and "actor keeps topology.segment 8" in rec.reason
        joined = fake.add_node(
            num_gpus=4, num_cpus=4, labels={GPU_DOMAIN_LABEL: "A", "pool": "h"}, ip="10.0.0.99"
        )
        domain_of[joined] = "A"
        rec = await until(lambda: (r := stored(fake, "tp")).state == "ready" and r)
        assert rec.slots[0].node_id == joined and _domains_of(fake, domain_of, "tp") == ["A", "A"]
        await ctl.stop()

    run(go())


def test_on_loss_span_takes_a_spare_of_another_domain():
    async def go():
        fake, domain_of = _fake(3, 2)
        ctl = await controller(fake)
        await ctl.reserve("tp", actor("0-7", on_loss="span"), 5)
        await ctl.reserve("other", {"num_nodes": 6, "component_placement": {"x": "8-11"}}, 5)
        fake.kill_node(stored(fake, "tp").slots[0].node_id)
        rec = await until(lambda: (r := stored(fake, "tp")).state == "ready" and r.epoch == 2 and r)
        assert _domains_of(fake, domain_of, "tp") == ["B", "A"]
        assert rec.reason == ""
        await ctl.stop()

    run(go())


def test_a_free_node_of_the_same_domain_is_taken_before_an_earlier_one_of_another():
    async def go():
        fake, domain_of = _fake(3, 3)
        ctl = await controller(fake)
        # B's nodes hold node ranks 3-5; the actor sits on B (ranks 3-4), B's third is free
        await ctl.reserve("tp", actor("12-19"), 5)
        assert _domains_of(fake, domain_of, "tp") == ["B", "B"]
        fake.kill_node(stored(fake, "tp").slots[0].node_id)
        await until(lambda: stored(fake, "tp").epoch == 2 and stored(fake, "tp").state == "ready")
        assert _domains_of(fake, domain_of, "tp") == ["B", "B"]
        await ctl.stop()

    run(go())


def _pool(a: int, b: int) -> ClusterView:
    """Domains A (``a`` nodes) and B (``b``), every node labelled pool=h."""
    view = domains(a, b)
    return ClusterView(
        nodes=[
            NodeView(
                num_gpus=n.num_gpus, node_id=n.node_id, ip=n.ip, labels={**n.labels, "pool": "h"}
            )
            for n in view.nodes
        ]
    )


def floating(count: int, segment: int | None = 8) -> dict:
    comp = {"node_group": "pool", "placement": f"0-{4 * count - 1}"}
    if segment:
        comp["topology"] = {"segment": segment}
    return {
        "num_nodes": 1,
        "node_groups": [{"label": "pool", "selector": {"pool": "h"}, "count": count}],
        "component_placement": {"actor": comp},
    }


def _free(view: ClusterView) -> dict:
    return {n.node_id: {"GPU": 4.0} for n in view.nodes}


def test_a_floating_group_takes_whole_blocks_of_one_domain():
    view = _pool(3, 4)
    spec = load_spec(floating(4))
    groups = list(spec.node_groups)
    chosen = choose_floating_nodes(spec, view, groups, _free(view))
    # A's third node is skipped: a segment of 8 spans 2 nodes, which must share a domain
    assert [view.nodes[r].node_id for r in chosen["pool"]] == ["A0", "A1", "B0", "B1"]
    cp = ComponentPlacement(spec, view, chosen)
    doms = [view.nodes[p.node_rank].labels[GPU_DOMAIN_LABEL] for p in cp.placements("actor")]
    assert doms == ["A"] * 8 + ["B"] * 8
    # without segments, the first four matching nodes, as before
    plain = load_spec(floating(4, segment=None))
    chosen = choose_floating_nodes(plain, view, list(plain.node_groups), _free(view))
    assert [view.nodes[r].node_id for r in chosen["pool"]] == ["A0", "A1", "A2", "B0"]


def test_a_floating_group_that_cannot_keep_its_segments_whole_is_refused():
    view = _pool(3, 3)
    spec = load_spec(floating(6))
    with pytest.raises(PlacementError, match="in whole blocks of 2 per NVLink domain; free"):
        choose_floating_nodes(spec, view, list(spec.node_groups), _free(view))
    odd = load_spec(floating(3, segment=8))
    with pytest.raises(PlacementError, match="count 3 is not a multiple of the 2 nodes"):
        choose_floating_nodes(odd, view, list(odd.node_groups), _free(view))


def test_the_controller_reserves_a_floating_group_in_whole_domain_blocks():
    async def go():
        fake, domain_of = _fake(3, 2)
        ctl = await controller(fake)
        # every GPU node matches; A has 3: the third would split a segment across domains
        await ctl.reserve("f", {**floating(4), "num_nodes": 6}, 5)
        assert sorted(_domains_of(fake, domain_of, "f")) == ["A", "A", "B", "B"]
        await ctl.stop()

    run(go())
