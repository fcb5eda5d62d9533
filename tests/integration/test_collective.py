"""The guarded group on a real local cluster: eight ranks on two nodes form it; every
process of the second node stops (a hung host: its ranks' connections stay open, Ray
calls them alive) while the first node's ranks wait in an all-reduce. Their call ends
with ``PeerLost`` naming ranks 4-7 within a second of the controller's verdict (its
``suspected`` event), not at gloo's 30 minutes; ``repair()`` relaunches the four
elsewhere, and the survivors, the same processes, form the next generation with them:
the all-reduce gives the sum over all eight again. gloo's own answer is what counts,
never placectl's record of itself."""

from __future__ import annotations

import os
import time

import pytest
import ray

import clients
from clients.testing import machines
from tests.integration.conftest import local_cluster

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def cluster():
    """Head (no GPUs) + three nodes of 4 fake GPUs: two to reserve, one free."""
    yield from local_cluster(gpu_nodes=3)


class Rank:
    def __init__(self) -> None:
        self.group = None

    def form(self, again: bool = False) -> str:
        from clients.collective import GuardedGroup

        self.group = self.group.reform(120) if again else GuardedGroup.form(120)
        return self.group.generation

    def reduce(self) -> dict:
        import torch

        from clients.collective import PeerLost

        t = torch.ones(2) * (int(os.environ["RANK"]) + 1)
        try:
            self.group.all_reduce(t)
        except PeerLost as e:
            return {"lost": e.ranks, "at": time.time(), "why": str(e), "pid": os.getpid()}
        return {
            "sum": t[0].item(),
            "pid": os.getpid(),
            "node": ray.get_runtime_context().get_node_id(),
        }


def test_a_hung_hosts_peers_end_the_survivors_all_reduce_at_the_verdict_and_reform(cluster, ctl):
    res = ctl.reserve("guarded", {"num_nodes": 3, "component_placement": {"actor": "0-7"}},
                      timeout_s=120)  # fmt: skip
    group = clients.WorkerGroup.launch(res, "actor", Rank)
    assert len(set(group.execute("form"))) == 1  # one generation for all eight
    assert {r["sum"] for r in group.execute("reduce")} == {36.0}
    before = group.execute("reduce")
    victim = before[4]["node"]
    assert {before[r]["node"] for r in range(4, 8)} == {victim} != {before[0]["node"]}
    node = next(n for n in cluster.list_all_nodes() if n.node_id == victim)
    procs = machines.hang(node)
    try:
        waiting = [group.actors[r].reduce.remote() for r in range(4)]
        ended = ray.get(waiting, timeout=60)  # gloo alone would wait 30 minutes
        told = [e for e in ctl.events() if e.kind == "suspected" and victim[:12] in e.message]
        assert len(told) == 1, (told, ended)
        for r, got in enumerate(ended):
            assert sorted(got.get("lost", {})) == [4, 5, 6, 7], (r, got)
            assert got["pid"] == before[r]["pid"]
            # Within a second of the verdict (the event's clock is the controller's).
            assert got["at"] - told[0].at < 1.0, (got["at"] - told[0].at, got["why"])
        assert group.repair(timeout=60) == [4, 5, 6, 7]
        # The survivors reform, the replacements form: the next generation, all eight.
        refs = [a.form.remote(again=r < 4) for r, a in enumerate(group.actors)]
        assert len(set(ray.get(refs, timeout=120))) == 1
        after = group.execute("reduce")
        assert {r["sum"] for r in after} == {36.0}
        assert [after[r]["pid"] for r in range(4)] == [before[r]["pid"] for r in range(4)]
        assert victim not in {after[r]["node"] for r in range(4, 8)}
    finally:
        machines.resume(node, procs)
    group.shutdown()
    ctl.release("guarded")


class Caller:
    def where(self) -> dict:
        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}

    def slow(self, seconds: float) -> int:
        time.sleep(seconds)
        return os.getpid()


def test_a_call_into_a_hung_hosts_ranks_gives_up_on_them_at_the_verdict(cluster, ctl):
    """No call into a lost rank waits past its verdict: a group's call waiting on ranks
    of a hung host (Ray calls it alive for about a minute) ends with ``RanksLost`` at the
    controller's verdict, carrying the other ranks' answers; a call that is only slow
    ends when it completes."""
    res = ctl.reserve("calls", {"num_nodes": 3, "component_placement": {"actor": "0-7"}},
                      timeout_s=120)  # fmt: skip
    group = clients.WorkerGroup.launch(res, "actor", Caller)
    try:
        assert len(set(group.execute("slow", 2.5))) == 8  # watched, never given up
        before = group.execute("where")
        victim = before[4]["node"]
        assert {before[r]["node"] for r in range(4, 8)} == {victim} != {before[0]["node"]}
        node = next(n for n in cluster.list_all_nodes() if n.node_id == victim)
        hung_at = time.time()
        procs = machines.hang(node)
        try:
            with pytest.raises(clients.RanksLost) as got:
                group.execute("where")
            ended = time.time()
            told = [e for e in ctl.events() if e.kind == "suspected" and e.at >= hung_at
                    and victim[:12] in e.message]  # fmt: skip
            assert len(told) == 1, told
            assert sorted(got.value.ranks) == [4, 5, 6, 7], got.value.ranks
            assert ended - told[0].at < 2.0, (ended - told[0].at, str(got.value))
            assert got.value.results == {r: before[r] for r in range(4)}  # the others' answers
            # Ray still calls the host's ranks alive: its own answer would come at its
            # verdict on the node, about a minute on.
            assert ray.get(group.actors[0].where.remote(), timeout=30) == before[0]
            with pytest.raises(clients.RanksLost):  # the verdict is in: at once
                group.execute_rank(5, "where")
            assert group.repair(timeout=60) == [4, 5, 6, 7]
            after = group.execute("where")
            assert [after[r] for r in range(4)] == before[:4]
            assert victim not in {after[r]["node"] for r in range(4, 8)}
        finally:
            machines.resume(node, procs)
    finally:
        group.shutdown()
        ctl.release("calls")
