"""RLinf's placement and cluster-config rules, as input and expected data written here.

Each case states what RLinf's own code does with the input (its placement strategies,
ComponentPlacement and ClusterConfig, read from its repository) and checks placectl does
the same; where placectl deliberately differs, the case says so and checks placectl's
documented behaviour instead (see docs/evidence/conformance.md).
"""

from __future__ import annotations

import pytest

from controller import (
    ClusterView,
    ComponentPlacement,
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    NodeView,
    PackedPlacementStrategy,
    PlacementError,
    SpecError,
    load_spec,
)
from controller.state.environment import group_env


def view(*gpus: int, **resources_of) -> ClusterView:
    return ClusterView(nodes=[NodeView(num_gpus=g) for g in gpus])


def where(ps):
    return [(p.node_rank, p.cuda_visible_devices, p.local_rank, p.local_world_size) for p in ps]


# ------------------------------------------------------------------ flexible strategy
def test_flexible_one_process_one_gpu():
    (p,) = FlexiblePlacementStrategy([[0]]).get_placement(view(4, 4))
    assert (p.node_rank, p.local_gpu_id, p.cuda_visible_devices, p.local_world_size) == (
        0,
        0,
        [0],
        1,
    )


def test_flexible_sorts_a_process_list():
    (p,) = FlexiblePlacementStrategy([[2, 1, 3]]).get_placement(view(4))
    assert p.cuda_visible_devices == [1, 2, 3] and p.local_gpu_id == 1


def test_flexible_orders_processes_by_their_first_rank():
    ps = FlexiblePlacementStrategy([[5], [1], [3]]).get_placement(view(8))
    assert [p.local_gpu_id for p in ps] == [1, 3, 5]


def test_flexible_local_ranks_and_nodes():
    assert where(FlexiblePlacementStrategy([[0], [1], [2]]).get_placement(view(4, 4))) == [
        (0, [0], 0, 3),
        (0, [1], 1, 3),
        (0, [2], 2, 3),
    ]
    ps = FlexiblePlacementStrategy([[0], [4], [8]]).get_placement(view(4, 4, 4))
    assert [(p.node_rank, p.local_world_size) for p in ps] == [(0, 1), (1, 1), (2, 1)]


@pytest.mark.parametrize(
    ("ranks", "message"),
    [
        ([[0, 4]], "span nodes"),
        ([[0], [8]], "out of range"),
        ([[0, 0]], "repeat a rank"),
        ([], "non-empty list"),
    ],
)
def test_flexible_errors(ranks, message):
    with pytest.raises(PlacementError, match=message):
        FlexiblePlacementStrategy(ranks).get_placement(view(4, 4))


# ------------------------------------------------------------------ node strategy
def test_node_strategy_counts_processes_per_node_and_shows_the_nodes_gpus():
    ps = NodePlacementStrategy([0, 0], "node").get_placement(view(2, 2))
    assert where(ps) == [(0, [0, 1], 0, 2), (0, [0, 1], 1, 2)]
    ps = NodePlacementStrategy([0, 1, 1, 2], "node").get_placement(view(1, 1, 1))
    assert [(p.node_rank, p.local_rank, p.local_world_size) for p in ps] == [
        (0, 0, 1),
        (1, 0, 2),
        (1, 1, 2),
        (2, 0, 1),
    ]
    (p,) = NodePlacementStrategy([0], "node").get_placement(view(0, 0))
    assert p.local_gpu_id == -1 and p.cuda_visible_devices == []
    (p,) = NodePlacementStrategy([0], "node").get_placement(view(2), isolate_gpu=False)
    assert p.cuda_visible_devices == [0, 1]
    with pytest.raises(PlacementError, match="node rank 2 is out of range"):
        NodePlacementStrategy([0, 2], "node").get_placement(view(1, 1))


# ------------------------------------------------------------------ packed strategy
# placectl's PackedPlacementStrategy has the signature the configuration reference fixes (master
# node and accelerator, a count of nodes or processes); RLinf's takes a start and end
# hardware rank. The same layouts, in placectl's terms:
def test_packed_layouts():
    ps = PackedPlacementStrategy(num_processes=4).get_placement(view(4))
    assert [p.cuda_visible_devices for p in ps] == [[0], [1], [2], [3]]
    assert {p.local_world_size for p in ps} == {4}
    ps = PackedPlacementStrategy(num_processes=2, num_gpus_per_process=2).get_placement(view(4))
    assert [p.cuda_visible_devices for p in ps] == [[0, 1], [2, 3]]
    ps = PackedPlacementStrategy(num_nodes=1, stride=2, num_gpus_per_process=2).get_placement(
        view(8)
    )
    assert [p.cuda_visible_devices for p in ps] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    with pytest.raises(PlacementError, match="master_gpu=4: out of range"):
        PackedPlacementStrategy(master_gpu=4, num_processes=1).get_placement(view(4))
    with pytest.raises(PlacementError, match="do not fit"):
        PackedPlacementStrategy(num_processes=1, num_gpus_per_process=8).get_placement(view(4))


# ------------------------------------------------------------------ the YAML block
def plan(block, v):
    return ComponentPlacement(block, v)


def test_gpu_group_and_the_node_group():
    block = {
        "num_nodes": 2,
        "node_groups": [{"label": "train", "node_ranks": "0-1"}],
        "component_placement": {
            "actor": {"node_group": "train", "placement": "0-3"},
            "env": {"node_group": "node", "placement": "0-1:0-3"},
            "reward": {"node_group": "train", "placement": "0-1"},
        },
    }
    cp = plan(block, view(4, 4))
    assert [p.resource_ranks for p in cp.placements("actor")] == [[0], [1], [2], [3]]
    assert isinstance(cp.get_strategy("env"), NodePlacementStrategy)
    assert [p.node_rank for p in cp.placements("env")] == [0, 0, 1, 1]


def test_all_ranges_and_a_shared_strategy():
    cp = plan({"num_nodes": 1, "component_placement": {"actor,reward": "all"}}, view(4))
    assert [p.local_gpu_id for p in cp.placements("actor")] == [0, 1, 2, 3]
    assert cp.get_strategy("actor") is cp.get_strategy("reward")
    block = {"num_nodes": 1, "component_placement": {"actor": "0-2,5,7", "inference": "3-4"}}
    cp = plan(block, view(8))
    assert [p.local_gpu_id for p in cp.placements("actor")] == [0, 1, 2, 5, 7]
    assert [p.local_gpu_id for p in cp.placements("inference")] == [3, 4]


@pytest.mark.parametrize(
    ("placement", "message"),
    [
        ("0-1,1-2", "resource rank 1 is used twice"),
        ("0-0:0,1-1:2", "1 is missing"),
    ],
)
def test_yaml_placement_errors(placement, message):
    with pytest.raises(PlacementError, match=message):
        plan({"num_nodes": 1, "component_placement": {"actor": placement}}, view(4))


def test_node_group_specific_allocations():
    block = {
        "num_nodes": 2,
        "node_groups": [{"label": "train", "node_ranks": 0}, {"label": "infer", "node_ranks": 1}],
        "component_placement": {
            "actor": {"node_group": "train", "placement": "0-1"},
            "rollout": {"node_group": "infer", "placement": "0"},
        },
    }
    cp = plan(block, view(4, 4))
    assert {p.node_rank for p in cp.placements("actor")} == {0}
    assert [p.node_rank for p in cp.placements("rollout")] == [1]


def test_component_placement_may_be_empty():
    cp = plan({"num_nodes": 1, "component_placement": {}}, view(8))
    assert cp.components == []


# ------------------------------------------------------------------ mixed node groups
HETERO = {
    "num_nodes": 1,
    "node_groups": [
        {
            "label": "gpu",
            "node_ranks": 0,
            "env_configs": [
                {"node_ranks": 0, "env_vars": [{"GPU_ENV": 1}], "python_interpreter_path": "/g"}
            ],
        },
        {
            "label": "franka",
            "node_ranks": 0,
            "hardware": {"type": "Franka", "configs": [{"node_rank": 0, "robot_ip": "10.0.0.9"}]},
            "env_configs": [
                {"node_ranks": 0, "env_vars": [{"FRANKA_ENV": 1}], "python_interpreter_path": "/f"}
            ],
        },
    ],
}


def test_gpu_and_franka_groups_on_one_node():
    block = {
        **HETERO,
        "component_placement": {"x": {"node_group": "gpu,franka", "placement": "0-1"}},
    }
    spec = load_spec(block)
    gpu, robot = ComponentPlacement(spec, view(1)).placements("x")
    assert (gpu.node_group, gpu.kind, gpu.local_resource_ranks, gpu.cuda_visible_devices) == (
        "gpu",
        "accelerator",
        [0],
        [0],
    )
    # the robot process sees the node's accelerators, as RLinf shows them
    assert (robot.node_group, robot.kind, robot.local_resource_ranks) == ("franka", "hardware", [0])
    assert robot.cuda_visible_devices == [0]
    # each group keeps its own environment and interpreter on the shared node
    assert group_env(spec, "gpu", 0) == ({"GPU_ENV": "1"}, "/g")
    assert group_env(spec, "franka", 0) == ({"FRANKA_ENV": "1"}, "/f")


def test_one_process_never_holds_two_kinds():
    block = {
        **HETERO,
        "component_placement": {"x": {"node_group": "gpu,franka", "placement": "0-1:0"}},
    }
    with pytest.raises(PlacementError, match="would hold Franka and accelerator"):
        plan(block, view(1))


def test_node_placement_across_groups_sees_each_nodes_gpus():
    block = {
        "num_nodes": 2,
        "node_groups": [
            {"label": "a", "node_ranks": 0, "ignore_hardware": True},
            {"label": "b", "node_ranks": 1, "ignore_hardware": True},
        ],
        "component_placement": {"x": {"node_group": "a,b", "placement": "0-1"}},
    }
    ps = plan(block, view(1, 2)).placements("x")
    assert [(p.node_group, p.node_rank, p.cuda_visible_devices) for p in ps] == [
        ("a", 0, [0]),
        ("b", 1, [0, 1]),
    ]


def test_ignore_hardware_makes_a_gpu_group_count_nodes():
    block = {
        "num_nodes": 2,
        "node_groups": [{"label": "cpu", "node_ranks": "0-1", "ignore_hardware": True}],
        "component_placement": {"x": {"node_group": "cpu", "placement": "0-1"}},
    }
    ps = plan(block, view(8, 8)).placements("x")
    assert [(p.kind, p.node_rank, p.local_gpu_id) for p in ps] == [("node", 0, -1), ("node", 1, -1)]
    block["node_groups"][0]["hardware"] = {"type": "Franka"}
    with pytest.raises(SpecError, match="ignore_hardware makes the group's resources its nodes"):
        load_spec(block)


# ------------------------------------------------------------------ the cluster block
