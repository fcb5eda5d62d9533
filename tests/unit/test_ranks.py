"""The rank grammar and every rule of the placement string (the configuration reference,
docs/reference/configuration.md), on one node with 8 GPUs."""

import pytest

from controller import ClusterView, ComponentPlacement, PlacementStringError
from controller.planning.ranks import format_ranks, parse_placement, parse_rank_list

ONE_NODE = ClusterView.uniform(num_nodes=1, gpus_per_node=8)
TWO_NODES = ClusterView.uniform(num_nodes=2, gpus_per_node=8)


def plan(placement, view=ONE_NODE):
    conf = {"num_nodes": view.num_nodes, "component_placement": {"c": placement}}
    return ComponentPlacement(conf, view).placements("c")


def gpus(placement, view=ONE_NODE):
    return [p.cuda_visible_devices for p in plan(placement, view)]


# ------------------------------------------------------------------ the spec's examples
def test_one_process_per_gpu():
    assert gpus("0-3") == [[0], [1], [2], [3]]


def test_int_means_string():
    assert gpus(4) == [[4]]


def test_each_process_holds_two_gpus():
    assert gpus("0-3:0-1") == [[0, 1], [2, 3]]


def test_two_processes_share_each_gpu():
    assert gpus("0-3:0-7") == [[0], [0], [1], [1], [2], [2], [3], [3]]


def test_mixed_segments_continue_ranks():
    assert gpus("0-1:0-3,2-3") == [[0], [0], [1], [1], [2], [3]]


def test_all_with_processes():
    assert gpus("all:0-15") == [[g] for g in range(8) for _ in range(2)]


def test_all_is_case_insensitive_and_spaces_are_allowed():
    assert gpus(" ALL : 0 - 7 ") == [[g] for g in range(8)]


def test_rlinf_mixed_example():
    # 0-1:0-3 → two per GPU; 3-5 → ranks 4,5,6; 7:7-8 would be 2 on GPU 7
    assert gpus("0-1:0-3,3-5,7:7-8") == [[0], [0], [1], [1], [3], [4], [5], [7], [7]]


def test_range_across_two_nodes():
    ps = plan("6-9", TWO_NODES)
    assert [(p.node_rank, p.local_gpu_id) for p in ps] == [(0, 6), (0, 7), (1, 0), (1, 1)]
    assert [p.placement_node_rank for p in ps] == [0, 0, 1, 1]
    assert [p.local_world_size for p in ps] == [2, 2, 2, 2]
    assert [p.local_rank for p in ps] == [0, 1, 0, 1]


# ------------------------------------------------------------------ rule violations
@pytest.mark.parametrize(
    ("placement", "fragment"),
    [
        ("0-2:0-1", "3 accelerators and 2 processes"),
        ("4-5,0-1", "ascending resource order"),
        ("0-3,2-5", "resource rank 2 is used twice"),
        ("0-8", "resource rank 8 in '0-8' is out of range (0-7)"),
        ("0-1:1-2", "0 is missing"),
        ("0-1:0-1,2-3:0-1", "process rank 0 appears twice"),
        ("0-1:0-1,2-3:4-5", "2-3 are missing"),
        ("0-3:all", "'all' at position 4 is not allowed for process ranks"),
        ("0-3,,4", "empty segment at position 4"),
        ("0-3,", "empty segment at position 4"),
        ("", "empty segment at position 0"),
        ("3-1", "range '3-1' runs backwards"),
        ("0-3:", "missing process ranks after ':'"),
        ("0-", "expected the end of the range '0-'"),
        ("-1", "expected a rank for resource ranks at position 0"),
        ("0-3:0-1:2", "unexpected ':' at position 7"),
        ("0 3", "unexpected '3' at position 2"),
        ("0-3x", "unexpected character 'x' at position 3"),
        ("alll", "unexpected character 'a' at position 0"),
        ("all-3", "unexpected '-'"),
    ],
)
def test_errors_quote_the_string(placement, fragment):
    with pytest.raises(PlacementStringError) as info:
        plan(placement)
    message = str(info.value)
    assert fragment in message
    assert repr(placement) in message
    assert "\n" not in message


def test_process_spanning_two_nodes_is_refused():
    assert gpus("6-9:0-1", TWO_NODES) == [[6, 7], [0, 1]]  # each stays on its node
    with pytest.raises(PlacementStringError, match="span nodes 0 and 1"):
        plan("7-8:0", TWO_NODES)
    # 4 processes of 4 GPUs from GPU 6: rank 0 would hold 6-9, across the boundary
    with pytest.raises(PlacementStringError, match="process 0 in '6-13:0-1'"):
        plan("6-13:0-1", TWO_NODES)


def test_huge_process_counts_are_refused_before_expansion():
    with pytest.raises(PlacementStringError, match="more than"):
        plan("0:0-99999999999")


def test_wrong_types():
    with pytest.raises(PlacementStringError, match="expected a string"):
        parse_placement([0, 1])
    with pytest.raises(PlacementStringError, match="expected a string"):
        parse_placement(True)
    with pytest.raises(PlacementStringError, match="never negative"):
        parse_placement(-2)


# ------------------------------------------------------------------ rank lists
def test_rank_lists():
    assert parse_rank_list("0-2,5") == [0, 1, 2, 5]
    assert parse_rank_list(3) == [3]
    assert parse_rank_list("All") is None
    with pytest.raises(PlacementStringError, match="rank 1 is listed twice"):
        parse_rank_list("0-1,1")
    with pytest.raises(PlacementStringError, match="rank 4 is out of range"):
        parse_rank_list("0-4", upper=4)
    with pytest.raises(PlacementStringError, match="'all' must stand alone"):
        parse_rank_list("all,1")
    with pytest.raises(PlacementStringError, match="empty range"):
        parse_rank_list("1,,2")


def test_format_ranks():
    assert format_ranks([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert format_ranks([3]) == "3"
    assert format_ranks([]) == ""
