"""The head restarts, with Ray's GCS fault tolerance on each of its stores: a Redis server
of the test's own, and the GCS's embedded RocksDB in a directory of the head's: its GCS
alone, then the whole head node (a new head on the same store, as after a reboot of the
head's machine). Checked against Ray's group table, the workers' own actor ids, a driver
that attaches afterwards, and a node lost after (and during) the restart, repaired as
before."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time

import pytest
import ray
from ray.util.placement_group import placement_group_table

import clients
from clients.driver_table import RayTable
from clients.testing import machines
from clients.testing.head import FaultTolerantCluster, restartable_cluster
from controller.errors import ClusterUnavailable
from tests.integration.conftest import placectl_cli, wait_for

GPUS = 4
JOB = "headjob"
SPEC = {"num_nodes": 3, "component_placement": {"actor,rollout": "0-7"}}


# What the store itself decides (everything kept through a GCS restart and through a new
# head) runs on both; what a driver does while the head is away, and a repair after it
# returns, reads the state those tests prove kept, the same on either store: on Redis
# alone (CI's alone phase, 40 s).
ON_ONE_STORE = {
    "test_a_read_gives_up_after_its_bound_with_a_clear_error",
    "test_a_node_lost_while_the_head_is_down_is_repaired_when_it_returns",
}


def pytest_generate_tests(metafunc):
    if "store" in metafunc.fixturenames:
        one = metafunc.function.__name__ in ON_ONE_STORE
        metafunc.parametrize("store", ["redis"] if one else ["redis", "rocksdb"], scope="module")


@pytest.fixture(scope="module")
def cluster(store):
    """A head without GPUs (GCS fault tolerance on the store of the parameter) and three
    nodes of 4 fake GPUs: two for the job, one spare."""
    if store == "redis" and shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/test installs it)")
    with restartable_cluster(gpu_nodes=3, gpus=GPUS, store=store) as c:
        yield c
        if ray.is_initialized():
            clients.connect(start=False).release_all()


def add_spare(c: FaultTolerantCluster) -> None:
    while sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")) < 3:
        c.add_node(num_cpus=GPUS, num_gpus=GPUS)
    c.wait_for_nodes()


def remove(c: FaultTolerantCluster, node_id: str, abrupt: bool = False) -> None:
    """The node leaves: politely (its raylet unregisters itself, as at a scale-down), or
    abruptly (every process killed at once, its workers too, nobody told: with
    ``remove_node`` alone a worker outlived its raylet, answered the repair's first look,
    and ``repair()`` rightly found nothing lost)."""
    node = next(n for n in c.worker_nodes if n.node_id == node_id)
    if abrupt:
        machines.crash(c, node)
    else:
        c.remove_node(node, allow_graceful=True)


class Worker:
    def where(self):
        ctx = ray.get_runtime_context()
        return ctx.get_actor_id(), ctx.get_node_id(), ctx.get_placement_group_id()


def groups_in_ray(ctl) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Ray's group table for the job's groups: state and node of every bundle."""
    table = placement_group_table()
    out = {}
    for slot in ctl.record(JOB).slots:
        entry = table[slot.group_id]
        nodes = entry["bundles_to_node_id"]
        out[slot.group_id] = (entry["state"], tuple(nodes[i] for i in sorted(nodes)))
    return out


def placectl_groups() -> dict[str, str]:
    return {
        gid: e["state"]
        for gid, e in placement_group_table().items()
        if (e.get("name") or "").startswith("placectl:")
    }


def snapshot(ctl, res) -> dict:
    record = ctl.record(JOB)
    return {
        "uid": record.uid,
        "epoch": record.epoch,
        "groups": groups_in_ray(ctl),
        "actor": res.assignments("actor"),
        "rollout": res.assignments("rollout"),
    }


def healthy(ctl, incarnation: str | None = None):
    """The controller has recovered (a new incarnation, when one is given) and follows
    node events again."""

    def check():
        try:
            h = ctl.health()
        except ray.exceptions.RayActorError:
            return False
        new = incarnation is None or h["incarnation"] != incarnation
        return new and h["recovered"] and h["node_events"] == "subscribed" and h

    return wait_for(check, timeout=120)


# A node removed after a GCS restart, from the removal: the reservation repaired (its slot
# on a spare, the new group created: the controller's `repaired` event) within 4 s, as
# without the restart; measured 0.3-0.9 s. A fence sent to a node Ray was already
# removing used to stall the GCS's update of it for 10 s.
SLOT_REPAIRED_S = 4.0
# repair() returns once the lost ranks run again: the slot, then four new Ray workers
# starting on the spare. Measured on 2 cores: 3.1-5.4 s; before the fix 11.7 s (6 runs
# of 6). The bound leaves the worker starts room on CI.
REPAIR_AFTER_RESTART_S = 8.0
# A node dying abruptly after a whole head restart is found silent first (the liveness
# watch, then the fence): slot 0.7-3.4 s, repair() 4.8-7.7 s; the bounds of an abrupt
# death without a restart (test_abrupt: repair() within 10 s).
ABRUPT_SLOT_REPAIRED_S, ABRUPT_REPAIR_S = 6.0, 10.0
# Alone: these bounds are measured figures with seconds of room; beside another lane's
# busy cluster repair() after a GCS restart took 9.7 s against the 8 s bound.
pytestmark = pytest.mark.alone


def lose_a_node_and_repair(c, ctl, res, group, abrupt: bool = False) -> None:
    """A node lost after the restart is repaired as before, and as fast: exactly its
    ranks relaunched, the others untouched, every worker where the reservation says."""
    before = res.assignments("actor")
    ids = [w[0] for w in group.execute("where")]
    lost = before[0].placement.node_id
    doomed = [r for r, a in enumerate(before) if a.placement.node_id == lost]
    epoch = res.epoch
    started, gone = time.monotonic(), time.time()
    remove(c, lost, abrupt)
    assert group.repair(timeout=120) == doomed
    took = time.monotonic() - started
    repaired = [e for e in ctl.events(JOB) if e.kind == "repaired" and e.epoch > epoch]
    assert repaired, [(e.kind, e.message) for e in ctl.events(JOB)]
    slot = repaired[0].at - gone
    slot_bound, repair_bound = (
        (ABRUPT_SLOT_REPAIRED_S, ABRUPT_REPAIR_S)
        if abrupt
        else (SLOT_REPAIRED_S, REPAIR_AFTER_RESTART_S)
    )
    assert slot < slot_bound, f"the slot was repaired {slot:.1f}s after the removal"
    assert took < repair_bound, f"repair() took {took:.1f}s after the removal"
    assert res.epoch > epoch and res.state == "ready"
    seen = group.execute("where")
    fresh = res.assignments("actor")
    assert [(n, g) for _, n, g in seen] == [
        (a.placement.node_id, a.placement_group_id) for a in fresh
    ]
    kept = [r for r in range(len(before)) if r not in doomed]
    assert [seen[r][0] for r in kept] == [ids[r] for r in kept]
    add_spare(c)


def test_a_gcs_restart_keeps_everything_and_calls_wait_for_it(cluster):
    ctl = clients.connect()
    res = ctl.reserve(JOB, SPEC, timeout_s=120)
    group = clients.WorkerGroup.launch(res, "actor", Worker, detached=True)
    ids = group.execute("where")
    before = snapshot(ctl, res)
    groups_before = placectl_groups()
    incarnation = ctl.check_alive()
    assert ctl.health()["gcs_store"] == cluster.store.name

    said: list[str] = []
    answers: dict[str, object] = {}

    def read_during_the_window():
        answers["record"] = clients.Controller(table=RayTable("placectl", said.append)).record(JOB)

    def status_during_the_window():
        answers["status"] = ctl.status(JOB)  # the controller's own GCS calls wait too

    readers = [
        threading.Thread(target=read_during_the_window),
        threading.Thread(target=status_during_the_window),
    ]
    cluster.head_node.kill_gcs_server()
    for t in readers:
        t.start()
    wait_for(lambda: said, timeout=30)  # the reader says why it waits, then waits on
    cluster.head_node.start_gcs_server()
    for t in readers:
        t.join(90)
    assert answers["record"].uid == before["uid"] and answers["status"].state == "ready"
    assert "the GCS does not answer (reading the reservation table)" in said[0]

    healthy(ctl)
    assert ctl.check_alive() == incarnation  # the controller lived through it
    assert snapshot(ctl, res) == before
    assert all(state == "CREATED" for state, _ in before["groups"].values())
    assert placectl_groups() == groups_before  # nothing removed, nothing made
    assert group.execute("where") == ids
    fresh = clients.Controller()  # a driver that attaches now reads the same
    assert fresh.reservation(JOB).assignments("rollout") == before["rollout"]
    assert ctl.status(JOB).state == "ready"
    shown = placectl_cli(cluster.address, "status")
    assert JOB in shown.stdout and "fault tolerance" not in shown.stderr

    lose_a_node_and_repair(cluster, ctl, res, group)


def test_a_read_gives_up_after_its_bound_with_a_clear_error(cluster, monkeypatch):
    monkeypatch.setenv("PLACECTL_GCS_WAIT_S", "5")
    reader = clients.Controller(table=RayTable("placectl", lambda m: None))
    cluster.head_node.kill_gcs_server()
    try:
        with pytest.raises(ClusterUnavailable, match="did not answer reading the reservation"):
            reader.record(JOB)
    finally:
        cluster.head_node.start_gcs_server()
    assert reader.record(JOB).state == "ready"


ATTACH = """
import json, ray, clients
ray.init(address={address!r}, logging_level="ERROR")
res = clients.connect(start=False).reservation({job!r})
print(json.dumps([[a.placement.node_id, a.placement_group_id, a.env["RANK"]]
                  for a in res.assignments("rollout")]))
"""


def attach_from_a_new_driver(c) -> list:
    out = subprocess.run(
        [sys.executable, "-c", ATTACH.format(address=c.address, job=JOB)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_whole_head_restart_keeps_everything(cluster):
    ctl = clients.connect(start=False)
    res = ctl.reservation(JOB)
    group = clients.WorkerGroup.attach(res, "actor", Worker)
    ids = group.execute("where")
    before = snapshot(ctl, res)
    groups_before = placectl_groups()
    old = ctl.health()

    ray.shutdown()  # this driver runs on the head, as drivers usually do
    cluster.restart_head()
    cluster.connect()

    ctl = clients.connect(start=False)
    now = healthy(ctl, old["incarnation"])
    assert now["node_id"] == cluster.head_node.node_id != old["node_id"]  # on the new head
    res = ctl.reservation(JOB)
    assert snapshot(ctl, res) == before
    assert placectl_groups() == groups_before
    group = clients.WorkerGroup.attach(res, "actor", Worker)
    assert group.execute("where") == ids  # the same processes, still running
    assert attach_from_a_new_driver(cluster) == [
        [a.placement.node_id, a.placement_group_id, a.env["RANK"]] for a in before["rollout"]
    ]
    group = clients.WorkerGroup.attach(res, "actor", Worker)
    lose_a_node_and_repair(cluster, ctl, res, group, abrupt=True)


def test_a_node_lost_while_the_head_is_down_is_repaired_when_it_returns(cluster):
    ctl = clients.connect(start=False)
    res = ctl.reservation(JOB)
    group = clients.WorkerGroup.attach(res, "actor", Worker)
    ids = group.execute("where")
    before = res.assignments("actor")
    lost = before[-1].placement.node_id
    doomed = [r for r, a in enumerate(before) if a.placement.node_id == lost]
    kept_groups = {s.group_id for s in res.info.slots if s.node_id != lost}
    epoch, uid = res.epoch, res.info.uid

    ray.shutdown()
    cluster.stop_head()
    remove(cluster, lost)
    cluster.start_head()
    cluster.connect()

    ctl = clients.connect(start=False)
    healthy(ctl)
    res = ctl.reservation(JOB)
    info = res.wait_ready(timeout=120, newer_than=epoch)
    assert info.uid == uid and lost not in {s.node_id for s in info.slots}
    assert kept_groups <= {s.group_id for s in info.slots}  # the survivor's group stays
    assert all(placectl_groups()[g] == "CREATED" for g in kept_groups)
    group = clients.WorkerGroup.attach(res, "actor", Worker)
    assert group.repair(timeout=120) == doomed
    seen = group.execute("where")
    assert [seen[r][0] for r in range(len(before)) if r not in doomed] == [
        ids[r][0] for r in range(len(before)) if r not in doomed
    ]
    group.shutdown()
    ctl.release(JOB)
