"""Which groups of Ray's group table wait outside every reservation, and the line that
names one (the CLI's; tests/integration/test_operations.py checks it against Ray)."""

from __future__ import annotations

from clients.outside import Waiting, describe, waiting


def entry(name: str, state: str, bundles: list[dict], why: str = "NO_RESOURCES") -> dict:
    """An entry as Ray 2.60's ``placement_group_table()`` gives it."""
    return {
        "name": name,
        "state": state,
        "bundles": dict(enumerate(bundles)),
        "stats": {"scheduling_state": why, "scheduling_attempt": 3},
    }


def test_only_groups_not_placectls_and_not_placed_wait_outside():
    table = {
        "bb": entry("vllm", "PENDING", [{"GPU": 1.0, "CPU": 1.0}] * 2),
        "aa": entry("", "RESCHEDULING", [{"GPU": 1.0}], why="INFEASIBLE"),
        "cc": entry("placectl:job:0", "PENDING", [{"GPU": 1.0}]),
        "dd": entry("placectl-demand:job", "PENDING", [{"GPU": 1.0}]),
        "ee": entry("trainer", "CREATED", [{"GPU": 1.0}], why="FINISHED"),
        "ff": entry("gone", "REMOVED", [{"GPU": 1.0}], why="REMOVED"),
    }
    found = waiting(table)
    assert [w.group_id for w in found] == ["aa", "bb"]
    assert found[1].resources == {"GPU": 2.0, "CPU": 2.0}
    assert (found[0].why, found[0].attempts) == ("INFEASIBLE", 3)


def test_the_line_names_the_group_what_it_asks_and_what_reservations_hold():
    group = Waiting("0123456789ab", "vllm", "PENDING", "NO_RESOURCES", 3, {"GPU": 2.0})
    line = describe(group, {"GPU": (8.0, 8.0), "TPU": (4.0, 4.0)})
    assert line == (
        "placement group 'vllm' (01234567) waits outside any reservation for 2 GPU "
        "(Ray: PENDING, NO_RESOURCES, 3 attempt(s)): reservations hold 8 of 8 GPU"
    )
    anonymous = Waiting("0123456789ab", "", "PENDING", "", 0, {"CPU": 0.5})
    assert describe(anonymous, {}).startswith("placement group 01234567 waits")
    assert "no reason given" in describe(anonymous, {})
