"""NVLink domains on a real local cluster: nodes state their domain as a Ray label
(``ray.io/gpu-domain``) or as NeMo-RL's resource (``nvlink_domain_<id>``); a reservation's
segments each sit in one domain per Ray's group table and Ray's node table, and a node
lost in a domain is replaced from the same domain, not from an earlier free node of
another."""

from __future__ import annotations

import pytest
import ray
from ray.util.placement_group import placement_group_table

import clients
from clients.testing.local import local_cluster
from controller.state.scheduling import group_handle

SPEC = {
    "num_nodes": 6,
    "component_placement": {
        # two GPUs per node: the actor's segment of 4 is two nodes, the rollout's one
        "actor": {"placement": "2-5", "topology": {"segment": 4}},
        "rollout": {"placement": "8-9", "topology": {"segment": 2}},
    },
}


@pytest.fixture(scope="module")
def domains():
    """Head (no GPUs); z0 in domain Z (topology rank 0: first in node order, the free node
    a careless repair would take); a1-a3 in domain A by Ray's label; b in domain B by
    NeMo-RL's resources. Two fake GPUs each."""
    gpu = {"num_cpus": 2, "num_gpus": 2}
    shapes = {"z0": {**gpu, "labels": {"ray.io/gpu-domain": "Z", "placectl.io/topo-rank": "0"}}}
    for i in (1, 2, 3):
        labels = {"ray.io/gpu-domain": "A", "placectl.io/topo-rank": str(i)}
        shapes[f"a{i}"] = {**gpu, "labels": labels}
    shapes["b"] = {**gpu, "resources": {"nvlink_domain_B": 1, "topo_rank": 10}}
    with local_cluster(nodes=list(shapes.values())) as (c, added):
        yield c, dict(zip(shapes, added, strict=True))


def _domain_by_ray(node_id: str) -> str:
    """The node's NVLink domain as Ray's node table states it."""
    n = next(n for n in ray.nodes() if n["NodeID"] == node_id)
    if "ray.io/gpu-domain" in (n.get("Labels") or {}):
        return n["Labels"]["ray.io/gpu-domain"]
    return next(
        k[len("nvlink_domain_") :] for k in n["Resources"] if k.startswith("nvlink_domain_")
    )


def _nodes_of(res, component: str) -> list[str]:
    """Where Ray put each rank's bundle, from Ray's group table."""
    out = []
    for a in res.assignments(component):
        table = placement_group_table(group_handle(a.placement_group_id))
        out.append(table["bundles_to_node_id"][a.bundle_index])
    return out


def test_segments_sit_in_one_domain_and_a_lost_node_is_replaced_from_its_domain(domains):
    c, nodes = domains
    ctl = clients.connect()
    try:
        res = ctl.reserve("tp", SPEC, timeout_s=120)
        res.wait_ready(timeout=120)
        actor = _nodes_of(res, "actor")
        assert [_domain_by_ray(n) for n in actor] == ["A"] * 4
        assert set(actor) == {nodes["a1"].node_id, nodes["a2"].node_id}
        assert [_domain_by_ray(n) for n in _nodes_of(res, "rollout")] == ["B"] * 2
        shown = {s.node_rank: s.topology for s in res.refresh().slots}
        assert shown[1] == "domain=A topo=1" and shown[4] == "domain=B topo=10"

        # a1 dies; the user waits at once. z0 is free and first in node order, a3 is
        # free in the actor's domain: the segment moves to a3.
        c.remove_node(nodes["a1"])
        res.wait_ready(timeout=120)
        actor = _nodes_of(res, "actor")
        assert set(actor) == {nodes["a3"].node_id, nodes["a2"].node_id}
        assert [_domain_by_ray(n) for n in actor] == ["A"] * 4
        assert res.epoch == 2
    finally:
        ctl.release("tp")
