"""Whether slots can ever fit their nodes: against totals, with what an apply keeps."""

from __future__ import annotations

from controller.state.plan import holders, shortfalls
from controller.state.records import BundleRecord, SlotRecord

TOTALS = {"n1": {"CPU": 4.0, "GPU": 4.0}, "n2": {"CPU": 8.0, "GPU": 8.0}}


def slot(node: str, gpus: int, node_cpus: float = 0.0, rank: int = 1) -> SlotRecord:
    bundles = [BundleRecord("accelerator", i, {"GPU": 1.0, "CPU": 1.0}) for i in range(gpus)]
    if node_cpus:
        bundles.append(BundleRecord("node", -1, {"CPU": node_cpus}))
    return SlotRecord(
        node_rank=rank, node_id=node, node_ip="10.0.0.2", group_name="g", bundles=bundles
    )


def test_what_fits_the_totals_passes_whatever_is_free():
    assert shortfalls([slot("n1", 4), slot("n2", 7, 1.0, rank=2)], TOTALS) == []


def test_more_than_a_node_has_is_named_with_the_numbers():
    assert shortfalls([slot("n1", 4, 1.0)], TOTALS) == [
        "node 1 (10.0.0.2) would need CPU 5; it has CPU 4 in total"
    ]


def test_slots_on_one_node_and_kept_slots_add_up():
    assert shortfalls([slot("n1", 2), slot("n1", 2, 0.5)], TOTALS) != []
    assert shortfalls([slot("n1", 1, 0.5)], TOTALS, kept=[slot("n1", 3)]) == [
        "node 1 (10.0.0.2) would need CPU 4.5; it has CPU 4 in total"
    ]
    assert shortfalls([slot("n1", 1)], TOTALS, kept=[slot("n1", 3)]) == []


def test_an_unknown_or_dead_node_is_left_to_the_wait():
    assert shortfalls([slot("gone", 64)], TOTALS) == []


def test_holders_name_at_most_a_few():
    assert holders([]) == ""
    assert holders(["b", "a"]) == " (held by a, b)"
    assert holders([f"j{i}" for i in range(6)]) == " (held by j0, j1, j2, j3 and 2 more)"
