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


def test_a_reservation_on_a_cluster_with_no_gpu_node_gets_its_nodes_and_gives_them_back(
    cluster, ctl
):
    with LocalAutoscaler(cluster, idle_timeout_s=IDLE_S) as scaler:
        res = ctl.reserve("grow", spec(), timeout_s=120)
        assert res.state == "ready"
        launched = set(scaler.settle())
        assert len(launched) == 2, "\n".join(m for _, m in scaler.log)  # two, no more
        group = clients.WorkerGroup.launch(res, "actor", Worker)
        assert set(group.execute("where")) == launched  # per Ray: the nodes it added
        assert demand_groups() == {}  # nothing asked for once placed
        group.shutdown()
        ctl.release("grow")
        wait_for(lambda: set(scaler.terminated) == launched, timeout=60)
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert not launched & alive


def test_a_lost_node_without_a_spare_is_replaced_by_a_node_the_autoscaler_adds(cluster, ctl):
    with LocalAutoscaler(cluster, idle_timeout_s=IDLE_S) as scaler:
        res = ctl.reserve("lose", spec(), timeout_s=120)
        group = clients.WorkerGroup.launch(res, "actor", Worker)
        first = set(scaler.settle())
        lost = res.assignments("actor")[0].placement.node_id
        doomed = [r for r, a in enumerate(res.assignments("actor")) if a.placement.node_id == lost]
        scaler.launched[lost].crash()  # no spare: the slot waits for a new node
        assert group.repair(timeout=120) == doomed
        (new,) = set(scaler.settle()) - first
        where = group.execute("where")
        assert {where[r] for r in doomed} == {new}  # per Ray: on the node it added
        assert demand_groups() == {}
        group.shutdown()
        ctl.release("lose")  # the nodes given back: the first test (here, on leaving)


def test_an_evicted_node_without_a_spare_moves_to_a_new_node_before_it_goes(cluster, ctl):
    """A pod deleted or evicted: SIGTERM to its `ray start --block`, which has Ray drain
    the node for 30 s and stop it once nothing runs there."""
    with LocalAutoscaler(cluster, idle_timeout_s=IDLE_S) as scaler:
        res = ctl.reserve("drain", spec(), timeout_s=120)
        group = clients.WorkerGroup.launch(res, "actor", Worker)
        first = set(scaler.settle())
        node = res.assignments("actor")[0].placement.node_id
        leaving = [r for r, a in enumerate(res.assignments("actor")) if a.placement.node_id == node]
        epoch = res.epoch
        evicted = scaler.launched[node]
        evicted.evict()
        info = res.wait_ready(timeout=90, newer_than=epoch)
        assert info.state == "ready" and node in info.leaving
        assert evicted.proc.poll() is None  # the node is still there: make before break
        (new,) = set(scaler.settle()) - first
        assert group.dead_ranks() == []  # nothing of the job died
        assert group.prepare() == leaving  # replacements start beside the running ranks
        wait_for(group.prepared_ready, timeout=60)
        moved = group.sync()  # swapped in: the old ones stopped, the node now idle
        assert moved.moved == leaving
        where = group.execute("where")
        assert {where[r] for r in leaving} == {new}  # per Ray: on the node it added
        evicted.wait_gone(timeout=60)  # Ray stops the drained node once idle
        assert group.dead_ranks() == []
        group.shutdown()
        ctl.release("drain")
