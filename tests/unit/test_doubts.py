"""What placectl believes of a node (controller.runtime.core.doubts), and the inbox that
feeds it (controller.runtime.core.inbox, applied by ClusterNodes.settle): every edge of
the state machine, and the facts it must drop; the failures page draws the same edges."""

from __future__ import annotations

import pathlib
import re

import msgspec
import pytest

from clients.testing.fake_cluster import FakeCluster
from controller.runtime.core import doubts
from controller.runtime.core.doubts import NodeRecord, step
from controller.runtime.core.inbox import Fact, Kind, Source
from controller.runtime.core.nodes import ClusterNodes
from tests.unit.fakes import run

ROOT = pathlib.Path(__file__).resolve().parents[2]


def fact(kind: Kind, when: float, detail: str = "") -> Fact:
    return Fact(node="n", kind=kind, source=Source.WATCH, when=when, detail=detail)


def walk(*facts: Fact) -> NodeRecord:
    record = NodeRecord(node="n")
    for f in facts:
        record = step(record, f) or record
    return record


def test_a_suspect_whose_slots_moved_comes_back_through_a_sweep():
    r = walk(fact(Kind.SILENT, 1), fact(Kind.SUSPECTED, 3), fact(Kind.MOVED, 4, "u1"))
    assert (r.phase, r.owed, r.since) == (doubts.MOVED, frozenset({"u1"}), 1)
    r = step(r, fact(Kind.ANSWERED, 6))
    assert r.phase == doubts.BACK and r.owed == {"u1"}
    r = step(r, fact(Kind.SWEPT, 7, "u1"))
    assert r.phase == doubts.HEALTHY and r.owed == frozenset()


def test_a_suspect_that_answers_with_nothing_moved_is_healthy_at_once():
    r = walk(fact(Kind.SILENT, 1), fact(Kind.SUSPECTED, 3), fact(Kind.ANSWERED, 4))
    assert r.phase == doubts.HEALTHY


def test_what_is_owed_is_kept_across_a_new_silence():
    r = walk(fact(Kind.SILENT, 1), fact(Kind.SUSPECTED, 2), fact(Kind.MOVED, 3, "u1"),
             fact(Kind.ANSWERED, 4), fact(Kind.SILENT, 5))  # fmt: skip
    assert r.phase == doubts.SILENT and r.owed == {"u1"} and r.since == 5
    assert step(r, fact(Kind.ANSWERED, 6)).phase == doubts.BACK  # the sweep still runs


def test_a_repair_that_commits_after_the_node_answered_still_owes_its_sweep():
    r = walk(fact(Kind.SILENT, 1), fact(Kind.SUSPECTED, 2), fact(Kind.ANSWERED, 3))
    assert step(r, fact(Kind.MOVED, 4, "u1")).phase == doubts.BACK


def test_an_answer_older_than_the_newest_observation_is_dropped():
    r = walk(fact(Kind.SILENT, 5))
    assert step(r, fact(Kind.ANSWERED, 4)) is None  # it left before the silence was seen
    assert step(r, fact(Kind.ANSWERED, 6)).phase == doubts.HEALTHY


def test_nothing_leaves_fenced_but_death_and_nothing_leaves_death():
    fenced = walk(fact(Kind.SILENT, 1), fact(Kind.FENCED, 2, "proof"))
    assert fenced.phase == doubts.FENCED and fenced.fenced == "proof"
    for kind in (Kind.ANSWERED, Kind.SILENT, Kind.SUSPECTED, Kind.MOVED, Kind.JOINED):
        assert step(fenced, fact(kind, 9)) is None
    dead = step(fenced, fact(Kind.DIED, 3))
    assert dead.phase == doubts.DEAD and dead.fenced == "proof"  # why it was fenced stays
    for kind in Kind:
        assert step(dead, fact(kind, 10)) is None


def test_every_edge_is_taken_and_no_other():
    """Each (phase, fact) pair either follows an edge of EDGES or changes no phase."""
    targets = {(frm, kind) for frm, kind, _ in doubts.EDGES}
    for phase in doubts.Phase:
        if phase in doubts.FINAL:
            continue
        for kind in Kind:
            base = NodeRecord(node="n", phase=phase, owed=frozenset({"u1"}))
            got = step(base, fact(kind, 1, "u1"))
            moved = got is not None and got.phase != phase
            assert not moved or (phase, kind) in targets, (phase, kind, got)
            if moved:
                assert (phase, kind, got.phase) in doubts.EDGES


def test_the_failures_page_draws_exactly_the_machines_edges():
    page = (ROOT / "docs" / "operations" / "failures.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \| `(\w+)` \|", page, flags=re.M)
    drawn = {(frm, kind, to) for frm, kind, to in rows}
    edges = {(frm.value, kind.value, to.value) for frm, kind, to in doubts.EDGES}
    assert drawn == edges


def test_a_read_of_ray_older_than_a_fence_never_brings_the_node_back():
    """The races the inbox ends: Ray's answer that a node is alive, asked before a fence,
    arrives after it (a confirm's dead_nodes read, a full node read): dropped, never
    applied; the node stays dead."""

    async def go():
        fake = FakeCluster()
        node = fake.add_node(num_gpus=2)
        nodes = ClusterNodes(fake)
        await nodes.refresh()
        assert nodes.alive(node)
        asked = 1.0  # a read of Ray's table left here
        nodes.post(Fact(node=node, kind=Kind.FENCED, source=Source.WATCH, when=2.0, detail="x"))
        nodes.post(Fact(node=node, kind=Kind.JOINED, source=Source.RAY_READ, when=asked))
        nodes.settle()
        assert not nodes.alive(node) and nodes.phase(node) == doubts.FENCED
        await nodes.refresh()  # Ray, not told yet, still lists it alive
        assert not nodes.alive(node)
        assert node not in {n.node_id for n in nodes.view("GPU").nodes}

    run(go())


@pytest.mark.parametrize("kind", [Kind.SUSPECTED, Kind.MOVED])
def test_a_node_in_doubt_is_out_of_placement_until_it_is_healthy(kind):
    async def go():
        fake = FakeCluster()
        node = fake.add_node(num_gpus=2)
        nodes = ClusterNodes(fake)
        await nodes.refresh()
        nodes.post(Fact(node=node, kind=Kind.SILENT, source=Source.WATCH, when=1.0))
        nodes.post(Fact(node=node, kind=Kind.SUSPECTED, source=Source.WATCH, when=2.0))
        if kind == Kind.MOVED:
            nodes.post(Fact(node=node, kind=Kind.MOVED, source=Source.REPAIR, when=3.0,
                            detail="u1"))  # fmt: skip
        nodes.settle()
        assert node not in {n.node_id for n in nodes.view("GPU").nodes}
        assert node in {n.node_id for n in nodes.alive_view("GPU").nodes}  # no demand there
        nodes.post(Fact(node=node, kind=Kind.ANSWERED, source=Source.WATCH, when=4.0))
        nodes.settle()
        if kind == Kind.MOVED:  # back: out until swept
            assert nodes.phase(node) == doubts.BACK
            assert node not in {n.node_id for n in nodes.view("GPU").nodes}
            nodes.post(Fact(node=node, kind=Kind.SWEPT, source=Source.WATCH, when=5.0,
                            detail="u1"))  # fmt: skip
            nodes.settle()
        assert nodes.phase(node) == doubts.HEALTHY
        assert node in {n.node_id for n in nodes.view("GPU").nodes}
        assert msgspec.structs.asdict(nodes.record(node))["owed"] == frozenset()

    run(go())
