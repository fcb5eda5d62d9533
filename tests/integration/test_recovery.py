"""The recovery flow a user writes, acted on the instant a node is gone or goes:
readiness that is true (checked against Ray's node table), a crashed worker back in its
own bundle, a drain's move. (``repair()`` the instant a node dies abruptly, with its
figures: test_abrupt.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
import ray

import clients
from clients.reservation import Reservation
from controller.runtime.edge.node_tasks import alive
from tests.integration.conftest import local_cluster, wait_for
from tests.integration.conftest import placectl_cli as cli

GPUS = 4


@pytest.fixture(scope="module")
def cluster():
    """Head (no GPUs) + three nodes of 4 fake GPUs: two to reserve, one spare."""
    yield from local_cluster(gpu_nodes=3)


def spec() -> dict:
    return {"num_nodes": 3, "component_placement": {"actor,rollout": "0-7"}}


def alive_nodes() -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


def add_spare(cluster) -> None:
    # A node just removed may still be alive in Ray's table: count only the nodes the
    # cluster still runs.
    running = {n.node_id for n in cluster.list_all_nodes()}
    wait_for(lambda: alive_nodes() <= running, timeout=60)
    while sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")) < 3:
        cluster.add_node(num_cpus=GPUS, num_gpus=GPUS)
    cluster.wait_for_nodes()


def remove(cluster, node_id: str) -> None:
    node = next(n for n in cluster.list_all_nodes() if n.node_id == node_id)
    cluster.remove_node(node, allow_graceful=False)  # every process killed, Ray not told


class Worker:
    def where(self):
        ctx = ray.get_runtime_context()
        return ctx.get_node_id(), ctx.get_placement_group_id(), os.environ["PLACECTL_EPOCH"]

    def serve(self) -> int:
        """Start a stand-in for an engine's server as a daemon does: in a session of
        its own, by a launcher that exits (so it is not the worker's child, which Ray
        ends with the worker)."""
        launch = "setsid sleep 600 >/dev/null 2>&1 & echo $!"
        return int(subprocess.run(["sh", "-c", launch], capture_output=True, text=True).stdout)


def check_group(res: Reservation, group: clients.WorkerGroup) -> None:
    """Every worker answers from where the reservation now puts it, per Ray."""
    seen = group.execute("where")
    assigned = res.assignments(group.component)
    assert [(n, g) for n, g, _ in seen] == [
        (a.placement.node_id, a.placement_group_id) for a in assigned
    ]
    assert {n for n, _, _ in seen} <= alive_nodes()


def test_wait_ready_reserve_and_status_never_hand_out_a_dead_node(cluster, ctl):
    res = ctl.reserve("truth", spec(), timeout_s=60)
    lost = res.info.slots[0].node_id
    epoch = res.epoch
    remove(cluster, lost)
    # Ray still lists the node alive (its health checks have not given up); the first
    # question asked about the reservation finds the raylet gone and tells Ray.
    status = ctl.status("truth")
    assert status.state != "ready" or lost not in {s.node_id for s in status.slots}
    assert lost not in alive_nodes()
    assert res.refresh().state != "ready" or lost not in {s.node_id for s in res.info.slots}
    again = ctl.reserve("truth", spec(), timeout_s=60)  # the idempotent path repairs first
    assert again.state == "ready" and again.epoch > epoch
    assert {s.node_id for s in again.info.slots} <= alive_nodes()
    info = res.wait_ready(timeout=60, newer_than=epoch)
    assert {s.node_id for s in info.slots} <= alive_nodes()
    assert {a.placement.node_id for a in res.assignments("rollout")} <= alive_nodes()
    ctl.release("truth")
    add_spare(cluster)


def test_repair_relaunches_a_crashed_worker_in_its_own_bundle(ctl):
    res = ctl.reserve("crash", spec(), timeout_s=60)
    group = clients.WorkerGroup.launch(res, "rollout", Worker)
    ids = [a._actor_id for a in group.actors]
    epoch = res.epoch
    ray.kill(group.actors[5], no_restart=True)  # an OOM kill: the node lives
    wait_for(lambda: group.dead_ranks() == [5], timeout=30)
    assert group.repair(timeout=60) == [5]
    assert res.epoch == epoch  # nothing was moved
    assert [a._actor_id for a in group.actors][:5] == ids[:5]
    assert group.actors[5]._actor_id != ids[5]
    check_group(res, group)
    assert group.repair(timeout=60) == []
    group.shutdown()
    ctl.release("crash")


def drain(node_id: str, seconds: float) -> None:
    """What a spot-notice handler or KubeRay does: Ray's own PREEMPTION drain, with a
    deadline (the node is not told anything else, and is killed at the deadline)."""
    from ray.core.generated.autoscaler_pb2 import DrainNodeReason

    gcs = ray._private.worker.global_worker.gcs_client  # as `ray drain-node` does
    deadline_ms = int((time.time() + seconds) * 1000)
    reason = DrainNodeReason.DRAIN_NODE_REASON_PREEMPTION
    accepted, why = gcs.drain_node(node_id, reason, "spot notice", deadline_ms)
    assert accepted, why


def test_a_draining_node_is_left_before_its_deadline_and_no_worker_dies(cluster, ctl):
    add_spare(cluster)  # the move needs one (a raylet started earlier may have died since)
    res = ctl.reserve("drain", spec(), timeout_s=60)
    group = clients.WorkerGroup.launch(res, "actor", Worker)
    before = res.assignments("actor")
    node = before[0].placement.node_id
    leaving = [r for r, a in enumerate(before) if a.placement.node_id == node]
    servers = group.execute("serve")
    epoch = res.epoch
    drain(node, seconds=120)
    # Make before break: the reservation is ready at a new epoch, off the node, while
    # every worker, those on the draining node included, still runs.
    info = res.wait_ready(timeout=60, newer_than=epoch)
    assert node not in {s.node_id for s in info.slots} and info.state == "ready"
    assert group.dead_ranks() == []
    moved = group.sync()  # the job moves its ranks at a step boundary of its choosing
    assert moved.moved == leaving and moved.kept == [r for r in range(8) if r not in leaving]
    check_group(res, group)  # each worker answers from its new place, per Ray
    # The node lives on until its deadline, and takes no task: the moved ranks ended
    # their servers themselves before they stopped (read from the process table).
    assert [alive(servers[r]) for r in leaving] == [False] * len(leaving)
    assert all(alive(servers[r]) for r in moved.kept)
    remove(cluster, node)  # the node goes at its deadline: nothing of the job was there
    assert group.dead_ranks() == []
    group.shutdown()
    ctl.release("drain")
    add_spare(cluster)


def test_an_operators_drain_moves_the_job_off_a_node_that_stays_and_uncordon_gives_it_back(
    cluster, ctl
):
    """`placectl drain NODE` (a node due for maintenance, a GPU throwing errors), on a
    real cluster: the job's slots there move make before break (no worker dies, Ray's
    node table still has the node alive: Ray is not draining it), the ranks follow at
    `sync()`, no new reservation lands there, and `placectl uncordon` gives it back."""
    add_spare(cluster)
    res = ctl.reserve("maint", spec(), timeout_s=60)
    group = clients.WorkerGroup.launch(res, "actor", Worker)
    before = res.assignments("actor")
    node = before[0].placement.node_id
    leaving = [r for r, a in enumerate(before) if a.placement.node_id == node]
    ip = next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node)
    epoch = res.epoch
    ops = {"PLACECTL_OPERATOR_TOKEN": "ops"}
    ctl.set_operator("ops")  # a wrong token is refused, and nothing moves
    refused = cli(cluster.address, "drain", node, env={"PLACECTL_OPERATOR_TOKEN": "wrong"})
    assert refused.returncode == 4 and "operator's token" in refused.stderr
    # Every node of a local cluster has this machine's address: it names none of them.
    unclear = cli(cluster.address, "drain", ip, env=ops)
    assert unclear.returncode == 2 and "name one by its id" in unclear.stderr
    done = cli(cluster.address, "drain", node[:12], "--why", "GPU 2 throws Xid 79", env=ops)
    assert done.returncode == 0 and "moving off it" in done.stdout and "maint" in done.stdout
    info = res.wait_ready(timeout=60, newer_than=epoch)
    assert node not in {s.node_id for s in info.slots} and info.state == "ready"
    assert group.dead_ranks() == []
    moved = group.sync()
    assert moved.moved == leaving
    check_group(res, group)
    assert node in alive_nodes()  # the node stays in Ray, alive and not draining
    gcs = ray._private.worker.global_worker.gcs_client
    assert node not in gcs.get_draining_nodes()
    listed = cli(cluster.address, "cordons", "-o", "json")
    assert [c["node"] for c in json.loads(listed.stdout)] == [node]
    group.shutdown()
    ctl.release("maint")
    other = ctl.reserve("after", spec(), timeout_s=60)  # two nodes: the cordoned one not
    assert node not in {s.node_id for s in other.info.slots}
    ctl.release("after")
    back = cli(cluster.address, "uncordon", node[:12], env=ops)
    assert back.returncode == 0 and "uncordoned" in back.stdout
    assert json.loads(cli(cluster.address, "cordons", "-o", "json").stdout) == []


def test_an_operators_fence_kills_the_node_in_ray_and_repair_relaunches_its_ranks(cluster, ctl):
    """`placectl fence NODE` (a GPU throwing Xid errors: the machine must go now), on a
    real cluster: Ray's node table says the node is dead and its raylet exits, the job's
    slots there are replaced at once, and `repair()` called the instant the command
    returns relaunches exactly the ranks that were there, each answering from where
    Ray puts it. The head is refused."""
    add_spare(cluster)
    res = ctl.reserve("fence", spec(), timeout_s=60)
    group = clients.WorkerGroup.launch(res, "actor", Worker)
    before = res.assignments("actor")
    node = before[0].placement.node_id
    there = [r for r, a in enumerate(before) if a.placement.node_id == node]
    ops = {"PLACECTL_OPERATOR_TOKEN": "ops"}
    ctl.set_operator("ops")
    head = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and not n["Resources"].get("GPU"))
    refused = cli(cluster.address, "fence", head[:12], env=ops)
    assert refused.returncode == 2 and "Ray's head" in refused.stderr and head in alive_nodes()
    done = cli(cluster.address, "fence", node[:12], "--why", "GPU 2 throws Xid 79", env=ops)
    assert done.returncode == 0, done.stderr
    assert "fenced" in done.stdout and "repaired at once: fence" in done.stdout
    assert group.repair(timeout=60) == there  # the instant the command returns
    assert node not in alive_nodes()  # Ray's own verdict
    process = next(n for n in cluster.list_all_nodes() if n.node_id == node)
    raylet = process.all_processes["raylet"][0].process
    wait_for(lambda: raylet.poll() is not None, timeout=60)  # told it is dead, it exits
    check_group(res, group)  # every rank answers from where Ray and the record put it
    assert node not in {s.node_id for s in res.info.slots}
    listed = json.loads(cli(cluster.address, "cordons", "-o", "json").stdout)
    assert [(c["node"], c["why"]) for c in listed] == [(node, "fenced: GPU 2 throws Xid 79")]
    group.shutdown()
    ctl.release("fence")
    cluster.remove_node(process, allow_graceful=False)
    assert cli(cluster.address, "uncordon", node[:12], env=ops).returncode == 0
    add_spare(cluster)
