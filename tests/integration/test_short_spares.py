"""Rollout that runs short and takes a held spare (``take_spares: true``) on a real local
cluster with no free node: a rollout node lost abruptly is placed on the spare the
trainers' standbys wait on, at once, rather than waiting for a node to join. The
trainers' standbys there end at their group's next ``refill_standbys()``, the rollout
replacements start in their bundles and serve once admitted; a node that joins is held
as the new spare and the trainers' standbys start there. And with a spare of each kind
(``spares: 2``) and rollout standbys beside ``on_loss: continue``, the rollout's lost ranks
are replaced by its standbys, promoted. Where each process runs is read from Ray's
runtime context in it, which processes are dead from Ray's actor table, and which are
the same from their process ids."""

from __future__ import annotations

import os
import time

import pytest
import ray

import clients
from tests.integration.conftest import GPUS_PER_NODE, local_cluster, remove, wait_for
from tests.integration.test_short import Engine  # the rollout engine of running short

JOB = "short-spares"
CONF = {
    "num_nodes": 3,  # head + the trainers' node + the rollout's node; the third: the spare
    "spares": 1,
    "component_placement": {
        "actor": {"placement": "0-3", "standby": True},
        "rollout": {"placement": "4-7", "on_loss": "continue", "take_spares": True},
    },
}
LOAD_S = 2.0  # a trainer's start (a model's load, stood in for)


@pytest.fixture(scope="module")
def cluster():
    """Head (no GPUs) + three nodes of 4 fake GPUs: the trainers', the rollout's and the
    spare: no node free."""
    yield from local_cluster(gpu_nodes=3)


class Trainer:
    """A trainer rank or its standby: loads, and says where it runs."""

    def __init__(self) -> None:
        time.sleep(LOAD_S)

    def seen(self) -> dict:
        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}


def standbys_on_one_node(group, but: str = "", timeout: float = 90.0) -> tuple[str, list]:
    """Once the group's four standbys run on one node other than ``but``: that node (as
    Ray says in each) and the standby actors."""

    def found():
        group.refill_standbys()
        actors = group.standbys
        nodes = {s["node"] for s in ray.get([a.seen.remote() for a in actors], timeout=30)}
        return (
            len(actors) == GPUS_PER_NODE
            and len(nodes) == 1
            and but not in nodes
            and (
                nodes.pop(),
                actors,
            )
        )

    return wait_for(found, timeout=timeout)


def dead(actor) -> bool:
    entry = ray._private.state.state.actor_table(actor._actor_id.hex()) or {}
    return entry.get("State") == "DEAD"


def test_a_lost_rollout_node_takes_the_spare_when_no_node_is_free(cluster):
    ctl = clients.connect()
    try:
        res = ctl.reserve(JOB, CONF, timeout_s=120)
        actor = clients.WorkerGroup.launch(res, "actor", Trainer, detached=True)
        spare, standbys = standbys_on_one_node(actor)
        rollout = clients.WorkerGroup.launch(res, "rollout", Engine, detached=True)
        rollout.push("load", 1, version=1)
        (lost_node,) = {ray.get(a.seen.remote())["node"] for a in rollout.live.values()}
        trainers = {ray.get(a.seen.remote())["node"] for a in actor.actors}
        assert len({lost_node, spare, *trainers}) == 3

        remove(cluster, lost_node)  # abruptly: every process of the node killed
        assert rollout.repair(timeout=120, hung_after=5) == [0, 1, 2, 3]
        # The trainers' next step boundary ends their standbys on the spare the slot took
        # (the controller took it once Ray's verdict was in: no node joined meanwhile).
        wait_for(lambda: (actor.refill_standbys(), not actor.standbys)[1], timeout=60)
        wait_for(lambda: all(dead(s) for s in standbys), timeout=30)
        # Their bundles free, the rollout replacements start there and serve once admitted.
        wait_for(lambda: rollout.replacements_ready() == [0, 1, 2, 3], timeout=120)
        assert rollout.admit() == [0, 1, 2, 3]
        rollout.push("load", 2, version=2)
        serving = rollout.serving(2)
        assert sorted(serving) == [0, 1, 2, 3]
        assert {ray.get(a.seen.remote())["node"] for a in serving.values()} == {spare}
        assert ray.get([a.generate.remote([r], 2) for r, a in serving.items()]) == [
            [0],
            [10],
            [20],
            [30],
        ]
        # The trainers kept running, on their node, the same processes.
        assert {ray.get(a.seen.remote())["node"] for a in actor.actors} == trainers
        # A node joins: it is held as the next spare, and the trainers' standbys start there.
        cluster.add_node(num_cpus=GPUS_PER_NODE, num_gpus=GPUS_PER_NODE)
        joined, _ = standbys_on_one_node(actor, but=spare)
        assert joined not in {spare, lost_node, *trainers}
    finally:
        ctl.release(JOB)


KINDS = {
    "num_nodes": 3,  # head + the trainers' node + the rollout's node; two spares beside
    "spares": 2,
    "component_placement": {
        "actor": {"placement": "0-3", "standby": True},
        "rollout": {"placement": "4-7", "on_loss": "continue", "standby": True},
    },
}


def pid_of(actor) -> int:
    """The process id of ``actor``, asked of the process (a standby has no rank to say)."""
    return ray.get(actor.__ray_call__.remote(lambda _self: os.getpid()), timeout=30)


def test_rollout_that_runs_short_is_replaced_by_its_standbys_on_a_spare_of_its_kind(cluster):
    """Two spares, one per kind of node: the rollout node lost abruptly takes the spare
    that runs rollout standbys; ``repair()`` returns at once with the lost ranks, and the
    replacements the job admits at its next push are those standby processes (the same
    pids, Ray's runtime context in them on that spare, each its lost rank's RANK), no
    process started; the trainers' standbys on the other spare are untouched."""
    alive = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")]
    for _ in range(4 - len(alive)):  # the trainers', the rollout's and a spare of each
        cluster.add_node(num_cpus=GPUS_PER_NODE, num_gpus=GPUS_PER_NODE)
    ctl = clients.connect()
    job = f"{JOB}-kinds"
    try:
        res = ctl.reserve(job, KINDS, timeout_s=120)
        actor = clients.WorkerGroup.launch(res, "actor", Trainer, detached=True)
        rollout = clients.WorkerGroup.launch(res, "rollout", Engine, detached=True)
        wait_for(lambda: len(res.refresh().spares) == 2, timeout=90)
        trainer_spare, trainer_standbys = standbys_on_one_node(actor)

        def rollout_standbys():
            rollout.refill_standbys()
            return len(rollout.standbys) == GPUS_PER_NODE and rollout.standbys

        standing = {pid_of(a) for a in wait_for(rollout_standbys, timeout=90)}
        rollout.push("load", 1, version=1)
        (lost_node,) = {ray.get(a.seen.remote())["node"] for a in rollout.live.values()}

        remove(cluster, lost_node)  # abruptly: every process of the node killed
        assert rollout.repair(timeout=120, hung_after=5) == [0, 1, 2, 3]
        # The push right after: admit() waits for the promotions (a job's push does).
        assert rollout.admit(wait_s=120) == [0, 1, 2, 3]
        rollout.push("load", 2, version=2)
        serving = rollout.serving(2)
        assert sorted(serving) == [0, 1, 2, 3]
        seen = {r: ray.get(a.seen.remote()) for r, a in serving.items()}
        assert {s["pid"] for s in seen.values()} == standing  # the standbys, promoted
        assert [seen[r]["rank"] for r in range(4)] == ["0", "1", "2", "3"]
        (node,) = {s["node"] for s in seen.values()}
        assert node not in (lost_node, trainer_spare)
        # The trainers' spare still runs their standbys, the same processes.
        assert not any(dead(s) for s in trainer_standbys)
        assert standbys_on_one_node(actor)[0] == trainer_spare
    finally:
        ctl.release(job)


def test_trainers_that_take_the_rollout_kinds_spare_end_its_standbys_and_start(cluster):
    """Case 3 of the faults in combination: a spare of each kind, the trainers' spare
    lost first (no node free to hold another), then the trainers' node. The trainers'
    repair takes the spare of the rollout's kind, on which rollout standbys hold every
    GPU: it ends them, so the trainers start there at once rather than waiting for the
    rollout group's next refill (a driver blocked in repair() never gets to it)."""
    alive = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")]
    for _ in range(4 - len(alive)):
        cluster.add_node(num_cpus=GPUS_PER_NODE, num_gpus=GPUS_PER_NODE)
    ctl = clients.connect()
    job = f"{JOB}-other"
    try:
        res = ctl.reserve(job, KINDS, timeout_s=120)
        actor = clients.WorkerGroup.launch(res, "actor", Trainer, detached=True)
        rollout = clients.WorkerGroup.launch(res, "rollout", Engine, detached=True)
        wait_for(lambda: len(res.refresh().spares) == 2, timeout=90)
        trainer_spare, _ = standbys_on_one_node(actor)

        def rollout_standbys():
            rollout.refill_standbys()
            return len(rollout.standbys) == GPUS_PER_NODE and rollout.standbys

        others = wait_for(rollout_standbys, timeout=90)
        (rollout_spare,) = {ray.get(a.__ray_call__.remote(
            lambda _s: ray.get_runtime_context().get_node_id())) for a in others}  # fmt: skip
        remove(cluster, trainer_spare)
        wait_for(lambda: len(res.refresh().spares) == 1, timeout=90)  # dropped, none free
        (trainers,) = {ray.get(a.seen.remote())["node"] for a in actor.actors}
        remove(cluster, trainers)
        started = time.monotonic()
        assert actor.repair(timeout=90, hung_after=5) == [0, 1, 2, 3]
        took = time.monotonic() - started
        assert {ray.get(a.seen.remote())["node"] for a in actor.actors} == {rollout_spare}
        assert took < 60, took
        wait_for(lambda: all(dead(s) for s in others), timeout=30)
        assert rollout.repair(timeout=30) == []  # the rollout ranks never noticed
        wait_for(lambda: (rollout.refill_standbys(), not rollout.standbys)[1], timeout=30)
    finally:
        ctl.release(job)
