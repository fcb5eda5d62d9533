"""The hold-down of flapping nodes, by itself (controller.runtime.core.flaps): counted
over a window, doubled while the node keeps flapping, forgotten after a quiet window."""

from __future__ import annotations

from controller.runtime.core.flaps import LONGEST, Flaps


def test_the_third_suspicion_in_the_window_holds_the_node_down_for_the_first_length():
    f = Flaps(after=3, window=600.0, first=120.0)
    assert f.suspected("n", 0.0) == 0 and f.suspected("n", 100.0) == 0
    assert f.held(100.0) == {}
    assert f.suspected("n", 200.0) == 120.0
    assert f.held(250.0) == {"n": 320.0}
    assert f.suspected("n", 300.0) == 0  # held down already: counted, nothing more
    assert f.held(320.0) == {}  # over


def test_suspicions_older_than_the_window_do_not_count():
    f = Flaps(after=3, window=60.0, first=10.0)
    assert [f.suspected("n", t) for t in (0.0, 50.0, 100.0)] == [0, 0, 0]  # 0.0 fell out
    assert f.suspected("n", 110.0) == 10.0


def test_a_node_held_down_again_soon_after_is_held_twice_as_long_up_to_the_longest():
    f = Flaps(after=1, window=600.0, first=10.0)
    t, lengths = 0.0, []
    for _ in range(8):
        length = f.suspected("n", t)
        lengths.append(length)
        t += length + 1.0  # suspected again a second after the hold-down ends
    assert lengths == [10, 20, 40, 80, 160, 320, 320, 320]
    assert max(lengths) == LONGEST * 10.0
    assert f.suspected("n", t + 700.0) == 10.0  # quiet for a window: afresh


def test_nodes_are_counted_apart_and_a_gone_node_is_forgotten():
    f = Flaps(after=2, window=600.0, first=10.0)
    assert f.suspected("a", 0.0) == 0 and f.suspected("b", 1.0) == 0
    assert f.suspected("a", 2.0) == 10.0
    version = f.version
    f.drop("a")
    assert f.held(3.0) == {} and f.version > version


def test_after_zero_holds_nothing_down():
    f = Flaps(after=0, window=600.0, first=10.0)
    assert all(f.suspected("n", float(t)) == 0 for t in range(10))
