"""ComponentPlacement: node groups, hardware, isolation, shared keys, colocation."""

import pytest

from controller import (
    ClusterView,
    ColocationError,
    ComponentPlacement,
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    NodeView,
    PlacementError,
)
from controller.state.environment import local_rank


def cp_of(block, view):
    return ComponentPlacement(block, view)


def where(ps):
    return [(p.node_rank, p.cuda_visible_devices) for p in ps]


# ------------------------------------------------------------------ shared keys
def test_components_under_one_key_share_strategy_and_placements():
    cp = cp_of(
        {"num_nodes": 1, "component_placement": {"actor,rollout": "0-3", "ref": "4-7"}},
        ClusterView.uniform(1, 8),
    )
    assert cp.components == ["actor", "rollout", "ref"]
    assert cp.get_strategy("actor") is cp.get_strategy("rollout")
    assert cp.get_strategy("ref") is not cp.get_strategy("actor")
    assert isinstance(cp.get_strategy("actor"), FlexiblePlacementStrategy)
    assert [p.cuda_visible_devices for p in cp.placements("rollout")] == [[0], [1], [2], [3]]
    assert [p.component for p in cp.placements("rollout")] == ["rollout"] * 4
    assert cp.world_size("actor") == cp.world_size("rollout") == 4
    # the strategy alone reproduces the component's placements
    alone = cp.get_strategy("ref").get_placement(cp.view)
    assert [p.cuda_visible_devices for p in alone] == [[4], [5], [6], [7]]


def test_unknown_component():
    cp = cp_of({"num_nodes": 1, "component_placement": {"a": 0}}, ClusterView.uniform(1, 1))
    with pytest.raises(PlacementError, match="unknown component 'b'; the configuration has a"):
        cp.placements("b")


def test_view_smaller_than_num_nodes():
    with pytest.raises(
        PlacementError, match=r"cluster\.num_nodes is 3, but the cluster has 2 nodes"
    ):
        cp_of({"num_nodes": 3, "component_placement": {"a": 0}}, ClusterView.uniform(2, 8))


# ------------------------------------------------------------------ node groups
GROUPS = {
    "num_nodes": 4,
    "node_groups": [
        {"label": "a", "node_ranks": "0-1"},
        {"label": "b", "node_ranks": 3},
        {"label": "robot", "node_ranks": 2, "hardware": {"type": "franka"}},
    ],
}
UNEVEN = ClusterView(
    nodes=[
        NodeView(num_gpus=2),
        NodeView(num_gpus=4),
        NodeView(num_gpus=0, resources={"franka": 3}),
        NodeView(num_gpus=8),
    ]
)


def test_group_ranks_count_its_nodes_in_order_on_uneven_nodes():
    cp = cp_of(
        {**GROUPS, "component_placement": {"x": {"node_group": "a", "placement": "1-3"}}}, UNEVEN
    )
    assert where(cp.placements("x")) == [(0, [1]), (1, [0]), (1, [1])]
    assert [p.resource_ranks for p in cp.placements("x")] == [[1], [2], [3]]
    assert {p.node_group for p in cp.placements("x")} == {"a"}


def test_several_groups_out_of_cluster_order():
    # 'b' (node 3, 8 GPUs) first, then 'a' (nodes 0-1, 6 GPUs): ranks 0-7 are on node 3
    cp = cp_of(
        {**GROUPS, "component_placement": {"x": {"node_group": "b,a", "placement": "7-9"}}},
        UNEVEN,
    )
    ps = cp.placements("x")
    assert where(ps) == [(3, [7]), (0, [0]), (0, [1])]
    assert [p.node_group for p in ps] == ["b", "a", "a"]
    assert [p.placement_node_rank for p in ps] == [0, 1, 1]


def test_out_of_range_message_names_groups_and_count():
    with pytest.raises(PlacementError, match=r"resource rank 6 in '0-6' is out of range \(0-5\)"):
        cp_of(
            {**GROUPS, "component_placement": {"x": {"node_group": "a", "placement": "0-6"}}},
            UNEVEN,
        )


def test_hardware_units_are_not_accelerators():
    cp = cp_of(
        {**GROUPS, "component_placement": {"env": {"node_group": "robot", "placement": "0-2:0-5"}}},
        UNEVEN,
    )
    ps = cp.placements("env")
    assert [p.local_resource_ranks for p in ps] == [[0], [0], [1], [1], [2], [2]]
    assert all(p.cuda_visible_devices == [] and p.local_gpu_id == -1 for p in ps)
    assert all(p.accelerator_share == 0.0 for p in ps)
    assert cp.pool("env").kind == "hardware"


def test_hardware_units_from_rlinf_configs():
    block = {
        "num_nodes": 3,
        "node_groups": [
            {"label": "gpu", "node_ranks": 0},
            {
                "label": "franka",
                "node_ranks": "1-2",
                "hardware": {"type": "Franka", "configs": [{"node_rank": 1}, {"node_rank": 2}]},
            },
        ],
        "component_placement": {"env": {"node_group": "franka", "placement": "0-1"}},
    }
    cp = cp_of(block, ClusterView.uniform(3, 8))  # no franka resource in the view
    assert [p.node_rank for p in cp.placements("env")] == [1, 2]


def test_hardware_resource_name_matches_case_insensitively():
    view = ClusterView(nodes=[NodeView(resources={"Franka": 2})])
    block = {
        "num_nodes": 1,
        "node_groups": [{"label": "r", "node_ranks": 0, "hardware": {"type": "franka"}}],
        "component_placement": {"env": {"node_group": "r", "placement": "all"}},
    }
    assert cp_of(block, view).world_size("env") == 2


def test_node_only_group_and_reserved_node_group():
    view = ClusterView(nodes=[NodeView(num_gpus=8), NodeView(num_gpus=0), NodeView(num_gpus=0)])
    block = {
        "num_nodes": 3,
        "node_groups": [{"label": "cpu", "node_ranks": "1-2"}],
        "component_placement": {
            "agent": {"node_group": "node", "placement": "0-1:0-3,2:4-5"},
            "tool": {"node_group": "cpu", "placement": "all"},
        },
    }
    cp = cp_of(block, view)
    agent = cp.placements("agent")
    assert [p.node_rank for p in agent] == [0, 0, 1, 1, 2, 2]
    # as in RLinf, a process on a node sees every accelerator of that node, holding none
    assert [p.cuda_visible_devices for p in agent] == [list(range(8))] * 2 + [[]] * 4
    assert {p.local_gpu_id for p in agent} == {-1}
    assert isinstance(cp.get_strategy("agent"), NodePlacementStrategy)
    # a group whose nodes have no accelerators: its resources are nodes
    assert [p.node_rank for p in cp.placements("tool")] == [1, 2]
    assert cp.pool("tool").kind == "node"


def test_node_resources_never_span_nodes():
    block = {
        "num_nodes": 2,
        "component_placement": {"x": {"node_group": "node", "placement": "0-1:0"}},
    }
    with pytest.raises(PlacementError, match="span nodes 0 and 1"):
        cp_of(block, ClusterView.uniform(2, 8))


def test_cluster_group_without_accelerators_uses_nodes():
    cp = cp_of({"num_nodes": 2, "component_placement": {"x": "0-1"}}, ClusterView.uniform(2, 0))
    assert [p.node_rank for p in cp.placements("x")] == [0, 1]


def test_groups_of_different_kinds_mix_and_the_same_kind_never_overlaps():
    # accelerators of 'a' (ranks 0-5) then franka units of 'robot' (6-8), as RLinf counts
    mixed = {**GROUPS, "component_placement": {"x": {"node_group": "a,robot", "placement": "5-7"}}}
    ps = cp_of(mixed, UNEVEN).placements("x")
    assert [(p.kind, p.node_rank, p.local_resource_ranks) for p in ps] == [
        ("accelerator", 1, [3]),
        ("hardware", 2, [0]),
        ("hardware", 2, [1]),
    ]
    assert [p.hardware for p in ps] == ["", "franka", "franka"]
    overlap = {
        "num_nodes": 2,
        "node_groups": [{"label": "p", "node_ranks": "0-1"}, {"label": "q", "node_ranks": 1}],
        "component_placement": {"x": {"node_group": ["p", "q"], "placement": 0}},
    }
    with pytest.raises(PlacementError, match="'p' and 'q' both contain node 1 and would count"):
        cp_of(overlap, ClusterView.uniform(2, 8))
    shared_node = {
        "num_nodes": 1,
        "node_groups": [
            {"label": "g", "node_ranks": 0},
            {"label": "r", "node_ranks": 0, "hardware": {"type": "franka"}},
        ],
        "component_placement": {
            "ok": {"node_group": "g,r", "placement": "0-2"},
            "bad": {"node_group": "g,r", "placement": "1-2:0"},
        },
    }
    view = ClusterView(nodes=[NodeView(num_gpus=2, resources={"franka": 1})])
    with pytest.raises(PlacementError, match="would hold accelerator and franka"):
        cp_of(shared_node, view)
    del shared_node["component_placement"]["bad"]
    ok = cp_of(shared_node, view).placements("ok")
    assert [(p.kind, p.local_resource_ranks) for p in ok] == [
        ("accelerator", [0]),
        ("accelerator", [1]),
        ("hardware", [0]),
    ]


def test_groups_needing_nodes_the_view_lacks():
    block = {
        "num_nodes": 2,
        "node_groups": [{"label": "p", "node_ranks": 1}],
        "component_placement": {"x": {"node_group": "p", "placement": 0}},
    }
    # fine on two nodes; the spec's num_nodes protects the view check
    assert cp_of(block, ClusterView.uniform(2, 1)).placements("x")[0].node_rank == 1


def test_floating_group_takes_matching_nodes():
    view = ClusterView(
        nodes=[
            NodeView(num_gpus=8, labels={"type": "H100"}),
            NodeView(num_gpus=8, labels={"type": "A800"}),
            NodeView(num_gpus=8, labels={"type": "A800"}),
        ]
    )
    block = {
        "num_nodes": 1,
        "node_groups": [{"label": "spare", "selector": {"type": "A800"}, "count": 2}],
        "component_placement": {"x": {"node_group": "spare", "placement": "7-8"}},
    }
    assert where(cp_of(block, view).placements("x")) == [(1, [7]), (2, [0])]
    chosen = ComponentPlacement(block, view, floating={"spare": [2, 1]})
    assert where(chosen.placements("x")) == [(2, [7]), (1, [0])]
    block["node_groups"][0]["count"] = 3
    with pytest.raises(PlacementError, match="needs 3 nodes matching"):
        cp_of(block, view)


# ------------------------------------------------------------------ isolation
def test_isolate_false_sees_all_the_components_gpus_on_the_node():
    block = {
        "num_nodes": 2,
        "component_placement": {"x": {"placement": "2-3:0,6-9", "isolate": False}},
    }
    ps = cp_of(block, ClusterView.uniform(2, 8)).placements("x")
    assert [p.cuda_visible_devices for p in ps] == [[2, 3, 6, 7]] * 3 + [[0, 1]] * 2
    # local_rank is always the index among the component's processes on the node
    assert [p.local_rank for p in ps] == [0, 1, 2, 0, 1]
    assert [p.local_world_size for p in ps] == [3, 3, 3, 2, 2]
    # the LOCAL_RANK variable indexes the process's first accelerator within its list
    assert [local_rank(p) for p in ps] == [0, 2, 3, 0, 1]
    assert [p.local_gpu_id for p in ps] == [2, 6, 7, 0, 1]
    assert [p.local_resource_ranks for p in ps] == [[2, 3], [6], [7], [0], [1]]


def test_isolate_true_sees_own_gpus():
    ps = cp_of(
        {"num_nodes": 1, "component_placement": {"x": "2-5:0-1"}}, ClusterView.uniform(1, 8)
    ).placements("x")
    assert [p.cuda_visible_devices for p in ps] == [[2, 3], [4, 5]]
    assert [p.local_gpu_id for p in ps] == [2, 4]
    assert [p.local_rank for p in ps] == [0, 1]


# ------------------------------------------------------------------ colocation
def test_colocated_components_split_each_gpu():
    cp = cp_of(
        {"num_nodes": 1, "component_placement": {"actor,rollout": "all", "ref": "0-1:0-3"}},
        ClusterView.uniform(1, 4),
    )
    assert [p.accelerator_share for p in cp.placements("actor")] == [0.25, 0.25, 0.5, 0.5]
    assert [p.accelerator_share for p in cp.placements("ref")] == [0.25] * 4
    uses = {(u.node_rank, u.local_index): u for u in cp.accelerator_uses()}
    assert uses[(0, 0)].processes == [("actor", 0), ("rollout", 0), ("ref", 0), ("ref", 1)]
    assert all(u.total <= 1.0 for u in uses.values())


def test_shares_round_down_to_ray_granularity():
    cp = cp_of({"num_nodes": 1, "component_placement": {"a,b,c": 0}}, ClusterView.uniform(1, 1))
    assert cp.placements("a")[0].accelerator_share == 0.3333


def test_explicit_share_and_defaults_split_the_rest():
    block = {
        "num_nodes": 1,
        "component_placement": {
            "engine": {"placement": "0-1:0", "accelerator_share": 0.5},
            "actor,rollout": "0-1",
        },
    }
    cp = cp_of(block, ClusterView.uniform(1, 2))
    assert cp.placements("engine")[0].accelerator_share == 0.5
    assert [p.accelerator_share for p in cp.placements("actor")] == [0.25, 0.25]


def test_oversubscribed_gpu_names_accelerator_and_processes():
    block = {
        "num_nodes": 1,
        "component_placement": {
            "a": {"placement": "0-1", "accelerator_share": 0.7},
            "b": {"placement": "1", "accelerator_share": 0.5},
        },
    }
    with pytest.raises(ColocationError) as info:
        cp_of(block, ClusterView.uniform(1, 2))
    message = str(info.value)
    assert "accelerator 1 of node 0 is over-subscribed" in message
    assert "a:1 asks 0.7, b:0 asks 0.5" in message


def test_explicit_shares_that_leave_nothing():
    block = {
        "num_nodes": 1,
        "component_placement": {"a": {"placement": 0, "accelerator_share": 1.0}, "b": 0},
    }
    with pytest.raises(ColocationError, match="leave nothing for the holders without"):
        cp_of(block, ClusterView.uniform(1, 1))


def test_multi_gpu_process_counts_on_each_of_its_gpus():
    block = {"num_nodes": 1, "component_placement": {"tp": "0-1:0", "actor": "0-1"}}
    cp = cp_of(block, ClusterView.uniform(1, 2))
    uses = cp.accelerator_uses()
    assert [u.processes for u in uses] == [[("tp", 0), ("actor", 0)], [("tp", 0), ("actor", 1)]]
    assert cp.placements("tp")[0].accelerator_share == 0.5


# ------------------------------------------------------------------ RLinf compatibility
RLINF_FRANKA = """
cluster:
  num_nodes: 3 # One training/rollout node + two robot controller nodes
  component_placement:
    actor:
      node_group: "4090"
      placement: 0 # Run on the first GPU of the training/rollout node
    env:
      node_group: franka
      placement: 0-1 # Two robots assigned to two envs, rank 0 and rank 1
    rollout:
      node_group: "4090"
      placement: 0:0-1 # Two rollout processes on the first GPU of the training/rollout node
  node_groups:
    - label: "4090"
      node_ranks: 0 # Node rank 0 is the training/rollout node
    - label: franka
      node_ranks: 1-2 # Node ranks 1 and 2 are the two robot controller nodes
      hardware:
        type: Franka
        configs:
          - robot_ip: ROBOT_IP_FOR_RANK1
            node_rank: 1 # The node rank of the first robot controller node
          - robot_ip: ROBOT_IP_FOR_RANK2
            node_rank: 2 # The node rank of the second robot controller node
"""


def test_rlinf_franka_block_plans_as_documented():
    # RLinf's real-world example: actor on the first GPU of node 0, two rollout processes
    # on that same GPU, one env per robot on nodes 1 and 2.
    view = ClusterView(nodes=[NodeView(num_gpus=1), NodeView(num_gpus=0), NodeView(num_gpus=0)])
    cp = cp_of(RLINF_FRANKA, view)
    assert cp.components == ["actor", "env", "rollout"]
    assert where(cp.placements("actor")) == [(0, [0])]
    assert where(cp.placements("rollout")) == [(0, [0]), (0, [0])]
    assert [(p.node_rank, p.local_resource_ranks) for p in cp.placements("env")] == [
        (1, [0]),
        (2, [0]),
    ]
    # three processes share the GPU
    assert [p.accelerator_share for p in cp.placements("rollout")] == [0.3333, 0.3333]


RLINF_DOC = """
cluster:
  num_nodes: 1
  component_placement:
    actor,inference: 0-7
"""


def test_rlinf_short_form_doc_example():
    cp = cp_of(RLINF_DOC, ClusterView.uniform(1, 8))
    for name in ("actor", "inference"):
        assert [p.cuda_visible_devices for p in cp.placements(name)] == [[g] for g in range(8)]
