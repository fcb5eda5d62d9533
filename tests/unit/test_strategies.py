"""The four strategies, used directly without a configuration file."""

import pytest

from controller import (
    ClusterView,
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    NodeView,
    PackedPlacementStrategy,
    PlacementError,
    StridedPlacementStrategy,
)


def where(placements):
    return [(p.node_rank, p.cuda_visible_devices) for p in placements]


# ------------------------------------------------------------------ packed
def test_packed_from_an_offset_crosses_to_the_next_node():
    ps = PackedPlacementStrategy(master_node=0, master_gpu=2, num_processes=3).get_placement(
        ClusterView.uniform(2, 4)
    )
    assert where(ps) == [(0, [2]), (0, [3]), (1, [0])]
    assert [p.rank for p in ps] == [0, 1, 2]
    assert all(p.world_size == 3 for p in ps)


def test_packed_num_nodes_places_what_fits():
    ps = PackedPlacementStrategy(num_nodes=2).get_placement(ClusterView.uniform(2, 4))
    assert len(ps) == 8
    assert [p.node_rank for p in ps] == [0] * 4 + [1] * 4
    assert [p.local_rank for p in ps] == [0, 1, 2, 3] * 2


def test_packed_blocks_never_span_nodes():
    # 3 GPUs per node, blocks of 2: GPU 2 of each node stays unused.
    ps = PackedPlacementStrategy(num_nodes=2, num_gpus_per_process=2).get_placement(
        ClusterView.uniform(2, 3)
    )
    assert where(ps) == [(0, [0, 1]), (1, [0, 1])]


def test_packed_with_stride():
    ps = PackedPlacementStrategy(num_processes=4, num_gpus_per_process=2, stride=2).get_placement(
        ClusterView.uniform(1, 8)
    )
    assert where(ps) == [(0, [0, 2]), (0, [1, 3]), (0, [4, 6]), (0, [5, 7])]


def test_packed_isolate_off_sees_all_its_gpus_on_the_node():
    ps = PackedPlacementStrategy(num_processes=3, isolate_gpu=False).get_placement(
        ClusterView.uniform(1, 8)
    )
    assert [p.cuda_visible_devices for p in ps] == [[0, 1, 2]] * 3
    assert [p.local_gpu_id for p in ps] == [0, 1, 2]
    assert [p.local_rank for p in ps] == [0, 1, 2]
    assert not any(p.isolate_gpu for p in ps)
    # get_placement can switch isolation off as well
    ps = PackedPlacementStrategy(num_processes=2).get_placement(
        ClusterView.uniform(1, 8), isolate_gpu=False
    )
    assert [p.cuda_visible_devices for p in ps] == [[0, 1]] * 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of num_nodes and num_processes"),
        ({"num_nodes": 1, "num_processes": 2}, "exactly one of num_nodes and num_processes"),
        ({"num_processes": 0}, "num_processes=0: expected an int >= 1"),
        ({"num_processes": 1, "stride": 0}, "stride=0"),
        ({"num_processes": 1, "master_gpu": -1}, "master_gpu=-1"),
        ({"num_processes": "2"}, "num_processes='2'"),
    ],
)
def test_packed_bad_arguments(kwargs, message):
    with pytest.raises(PlacementError) as info:
        PackedPlacementStrategy(**kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_processes": 9}, "9 processes of 1 accelerator(s)"),
        ({"num_processes": 1, "master_node": 2}, "master_node=2: out of range"),
        ({"num_processes": 1, "master_gpu": 4}, "master_gpu=4: out of range"),
        ({"num_nodes": 3}, "the group has only 2 nodes"),
    ],
)
def test_packed_does_not_fit(kwargs, message):
    with pytest.raises(PlacementError) as info:
        PackedPlacementStrategy(**kwargs).get_placement(ClusterView.uniform(2, 4))
    assert message in str(info.value)


def test_packed_needs_accelerators():
    with pytest.raises(PlacementError, match="places accelerators"):
        PackedPlacementStrategy(num_processes=1).get_placement(ClusterView.uniform(2, 0))


# ------------------------------------------------------------------ strided
def test_strided_spec_example():
    ps = StridedPlacementStrategy(stride=2, num_gpus_per_process=2).get_placement(
        ClusterView.uniform(1, 8)
    )
    assert [p.cuda_visible_devices for p in ps] == [[0, 2], [1, 3], [4, 6], [5, 7]]


def test_strided_over_two_nodes():
    ps = StridedPlacementStrategy(
        master_node=0, num_nodes=2, stride=2, num_gpus_per_process=2
    ).get_placement(ClusterView.uniform(2, 4))
    assert where(ps) == [(0, [0, 2]), (0, [1, 3]), (1, [0, 2]), (1, [1, 3])]


def test_strided_requires_whole_groups_and_isolation():
    with pytest.raises(PlacementError, match="node 0 has 6 accelerators, not a multiple of 4"):
        StridedPlacementStrategy(stride=2, num_gpus_per_process=2).get_placement(
            ClusterView.uniform(1, 6)
        )
    with pytest.raises(PlacementError, match="needs isolate_gpu=True"):
        StridedPlacementStrategy(stride=2, isolate_gpu=False)
    with pytest.raises(PlacementError, match="needs isolate_gpu=True"):
        StridedPlacementStrategy(stride=2).get_placement(
            ClusterView.uniform(1, 8), isolate_gpu=False
        )


# ------------------------------------------------------------------ flexible / node
def test_flexible_explicit_lists():
    ps = FlexiblePlacementStrategy([[0, 1], [7], [8, 9]]).get_placement(ClusterView.uniform(2, 8))
    assert where(ps) == [(0, [0, 1]), (0, [7]), (1, [0, 1])]
    assert [p.resource_ranks for p in ps] == [[0, 1], [7], [8, 9]]


def test_flexible_errors():
    view = ClusterView.uniform(2, 8)
    with pytest.raises(PlacementError, match="span nodes"):
        FlexiblePlacementStrategy([[7, 8]]).get_placement(view)
    with pytest.raises(PlacementError, match="resource rank 16 is out of range"):
        FlexiblePlacementStrategy([[16]]).get_placement(view)
    with pytest.raises(PlacementError, match="non-empty list"):
        FlexiblePlacementStrategy([])
    with pytest.raises(PlacementError, match="process 1: expected a non-empty list"):
        FlexiblePlacementStrategy([[0], []])
    with pytest.raises(PlacementError, match="node_group 'a800'"):
        FlexiblePlacementStrategy([[0]], node_group="a800")


def test_node_strategy_repeats_allowed_and_no_gpu():
    view = ClusterView.uniform(3, 8)
    ps = NodePlacementStrategy([2, 0, 2]).get_placement(view)  # sorted, as in RLinf
    assert [p.node_rank for p in ps] == [0, 2, 2]
    assert all(p.cuda_visible_devices == list(range(8)) and p.local_gpu_id == -1 for p in ps)
    assert [p.placement_node_rank for p in ps] == [0, 1, 1]
    assert [p.local_rank for p in ps] == [0, 0, 1]
    assert [p.local_world_size for p in ps] == [1, 2, 2]
    with pytest.raises(PlacementError, match="node rank 3 is out of range"):
        NodePlacementStrategy([3]).get_placement(view)


def test_strategies_fill_node_identity_from_the_view():
    view = ClusterView(
        nodes=[NodeView(num_gpus=1, node_id="aa", ip="10.0.0.1"), NodeView(num_gpus=1)]
    )
    (p,) = PackedPlacementStrategy(num_processes=1).get_placement(view)
    assert (p.node_id, p.node_ip) == ("aa", "10.0.0.1")
