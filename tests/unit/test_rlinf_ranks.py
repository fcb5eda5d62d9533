"""How a ReservedCluster judges RLinf's placement of a rank against the reservation.

RLinf's own ``Placement`` records (as its strategies produce them) against placectl
assignments: a rank is started only where RLinf and placectl name the same Ray node and
the same accelerators; otherwise the driver is told which, and what to do.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("rlinf.scheduler", reason="rlinf==0.3.0 is installed by scripts/test")

from rlinf.scheduler.placement import Placement as RlinfPlacement

from clients.integrations.rlinf_agreement import check_rank
from controller.errors import PlacementError
from controller.planning.placement import Placement
from controller.state.assignments import Assignment

NODES = [
    SimpleNamespace(ray_id="aa" * 28, node_ip="10.0.0.1"),
    SimpleNamespace(ray_id="bb" * 28, node_ip="10.0.0.2"),
]
CLUSTER = SimpleNamespace(get_node_info=lambda k: NODES[k])


def rlinf(node: int, gpu: int, rank: int = 0) -> RlinfPlacement:
    return RlinfPlacement(
        rank=rank,
        cluster_node_rank=node,
        placement_node_rank=0,
        local_accelerator_rank=gpu,
        accelerator_type="NV_GPU",
        local_rank=0,
        local_world_size=1,
        visible_accelerators=[str(gpu)],
        isolate_accelerator=True,
        local_hardware_ranks=[gpu],
        node_group_label="cluster",
    )


def held(node: int, planned: int, physical: int, rank: int = 0) -> Assignment:
    p = Placement(
        rank=rank,
        world_size=1,
        component="actor",
        node_group="cluster",
        node_rank=node,
        node_id=NODES[node].ray_id,
        node_ip=NODES[node].node_ip,
        placement_node_rank=0,
        resource_ranks=[planned],
        local_resource_ranks=[planned],
        local_gpu_id=physical,
        cuda_visible_devices=[physical],
        isolate_gpu=True,
        local_rank=0,
        local_world_size=1,
        accelerator_share=1.0,
    )
    return Assignment(
        placement=p,
        placement_group_id="00" * 18,
        bundle_index=planned,
        num_gpus=1.0,
        num_cpus=1.0,
        capture_child_tasks=False,
        env={},
        epoch=1,
    )


def test_a_rank_both_place_alike_is_started():
    check_rank(CLUSTER, "actor", rlinf(1, 2), held(1, 2, 2))


def test_a_rank_rlinf_would_put_on_another_node_is_refused_with_the_remedy():
    with pytest.raises(PlacementError) as e:
        check_rank(CLUSTER, "actor", rlinf(0, 2), held(1, 2, 2))
    msg = str(e.value)
    assert "actor:0" in msg and "10.0.0.1" in msg and "10.0.0.2" in msg
    assert "RLINF_NODE_RANK" in msg and "\n" not in msg


def test_a_rank_whose_accelerator_ray_granted_another_job_is_refused():
    # RLinf numbers the node's accelerators from 0; Ray granted this bundle GPU 6
    with pytest.raises(PlacementError, match=r"accelerator\(s\) \[2\].*granted its bundle \[6\]"):
        check_rank(CLUSTER, "actor", rlinf(1, 2), held(1, 2, 6))


def test_a_rank_holding_other_accelerators_than_planned_is_refused():
    held_other = r"RLinf holds local accelerator \[3\], placectl \[2\]"
    with pytest.raises(PlacementError, match=held_other):
        check_rank(CLUSTER, "actor", rlinf(1, 3), held(1, 2, 2))
