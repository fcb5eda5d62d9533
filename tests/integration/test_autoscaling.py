"""A cluster that grows and shrinks under the job: an autoscaler that adds 4-GPU nodes
only for the demand Ray reports (what Ray's own autoscaler reads) and removes them once
idle. Where each worker runs is read from Ray, never from placectl."""

from __future__ import annotations

import pytest
import ray

import clients
from clients.testing.autoscaler import LocalAutoscaler
from tests.integration.conftest import live_groups, local_cluster, wait_for


@pytest.fixture(scope="module")
def cluster():
    """A head without GPUs and no other node: GPU nodes come from the autoscaler."""
    yield from local_cluster(gpu_nodes=0)


# Between nodes joining and the reservation's groups placed on them (Ray reports the
# demand's resources free, placectl plans and places), and between a lost node and its
# replacement's groups, the nodes are idle for a moment: seconds on a loaded machine.
# Ray's and KubeRay's idle timeouts are 60 s; a 3 s one took the nodes back in that
# moment (two more launched) on CI. Every test here uses 15 s.
IDLE_S = 15


def spec() -> dict:
    return {"num_nodes": 3, "component_placement": {"actor": "0-7"}}


class Worker:
    def where(self) -> str:
        return ray.get_runtime_context().get_node_id()


def demand_groups() -> dict:
    return live_groups("placectl-demand:")


def alive() -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


# Alone: the move must land inside the eviction's 30 s drain; beside another lane's busy
# cluster it once took over 25 s, and the node was gone before the slot was seen leaving.
@pytest.mark.alone
def test_a_reservation_gets_its_nodes_moves_and_is_repaired_onto_new_ones_and_gives_them_back(
    cluster, ctl
):
    """One reservation through an autoscaler's whole life, each phase as the one before
    left it (one scale-up, one give-back: each costs CI's 2 cores about 20 s)."""
    with LocalAutoscaler(cluster, idle_timeout_s=IDLE_S) as scaler:
        # A cluster with no GPU node: the reservation gets exactly two, and is ready.
        res = ctl.reserve("grow", spec(), timeout_s=120)
        assert res.state == "ready"
        launched = set(scaler.settle())
        assert len(launched) == 2, "\n".join(m for _, m in scaler.log)  # two, no more
        group = clients.WorkerGroup.launch(res, "actor", Worker)
        assert set(group.execute("where")) == launched  # per Ray: the nodes it added
        assert demand_groups() == {}  # nothing asked for once placed

        # A pod deleted or evicted, no spare: SIGTERM to its `ray start --block`, which
        # has Ray drain the node for 30 s and stop it once nothing runs there. The slot
        # moves to a node the autoscaler adds before it goes; no worker dies.
        node = res.assignments("actor")[0].placement.node_id
        leaving = [r for r, a in enumerate(res.assignments("actor")) if a.placement.node_id == node]
        epoch = res.epoch
        evicted = scaler.launched[node]
        evicted.evict()
        info = res.wait_ready(timeout=90, newer_than=epoch)
        assert info.state == "ready" and node in info.leaving
        assert evicted.proc.poll() is None  # the node is still there: make before break
        (new,) = set(scaler.settle()) - launched
        launched.add(new)
        assert group.dead_ranks() == []  # nothing of the job died
        assert group.prepare() == leaving  # replacements start beside the running ranks
        wait_for(group.prepared_ready, timeout=60)
        moved = group.sync()  # swapped in: the old ones stopped, the node now idle
        assert moved.moved == leaving
        where = group.execute("where")
        assert {where[r] for r in leaving} == {new}  # per Ray: on the node it added
        evicted.wait_gone(timeout=60)  # Ray stops the drained node once idle
        assert group.dead_ranks() == []

        # The other first node lost without a word, no spare: the slot waits for a node
        # the autoscaler adds, and repair() relaunches exactly its ranks there.
        assignments = res.assignments("actor")
        lost = next(a.placement.node_id for a in assignments if a.placement.node_id != new)
        doomed = [r for r, a in enumerate(assignments) if a.placement.node_id == lost]
        scaler.launched[lost].crash()
        assert group.repair(timeout=120) == doomed
        (added,) = set(scaler.settle()) - launched
        launched.add(added)
        where = group.execute("where")
        assert {where[r] for r in doomed} == {added}  # per Ray: on the node it added
        assert set(where) == {new, added}
        assert demand_groups() == {}

        # Released: every node it added goes once idle.
        group.shutdown()
        ctl.release("grow")
        wait_for(lambda: not launched & alive(), timeout=60)
    assert demand_groups() == {}


def test_a_spare_no_free_node_can_be_is_held_on_a_node_the_autoscaler_adds(cluster, ctl):
    """``spares: 1`` on a cluster with no free node: the controller asks for one more node
    of the job's kind, and holds its group on the node the autoscaler adds for it (read
    from Ray's placement group table); released, both nodes go."""
    with LocalAutoscaler(cluster, idle_timeout_s=IDLE_S) as scaler:
        config = {"num_nodes": 2, "component_placement": {"actor": "0-3"}, "spares": 1}
        res = ctl.reserve("spared", config, timeout_s=120)
        assert res.state == "ready"
        held = wait_for(lambda: res.refresh().spares, timeout=120)
        launched = set(scaler.settle())
        assert len(launched) == 2, "\n".join(m for _, m in scaler.log)  # the job's, the spare's
        (spare,) = held
        table = ray.util.placement_group_table()[spare.group_id]
        assert table["state"] == "CREATED"
        (on,) = set(table["bundles_to_node_id"].values())
        assert on in launched and on not in {s.node_id for s in res.refresh().slots}
        wait_for(lambda: not demand_groups(), timeout=60)  # nothing asked once held
        ctl.release("spared")
        wait_for(lambda: not launched & alive(), timeout=60)
    assert demand_groups() == {}
