"""The controller's lifecycle on a real local cluster, observed through the GCS table only
(what drivers read), never through calls that could wake the controller up."""

from __future__ import annotations

import subprocess
import sys

import msgspec
import pytest
import ray
from ray.experimental import internal_kv
from ray.util.placement_group import placement_group_table

import clients
from clients.testing.legacy import rewrite_as_v1, v1_table
from controller.errors import StaleReservation, TableUnreadable
from controller.runtime.core.nodes import live_view
from controller.runtime.edge.ray_io import node_infos
from controller.state.table import KV_NAMESPACE, RECORD, key, kv_prefix
from tests.integration.conftest import live_groups, local_cluster, wait_for

GPUS = 4


@pytest.fixture(scope="module")
def cluster():
    """Head (no GPUs) + three nodes of 4 fake GPUs: two to reserve, one spare."""
    yield from local_cluster(gpu_nodes=3)


def spec(placement: str, num_nodes: int = 3, **more) -> dict:
    return {"num_nodes": num_nodes, "component_placement": {"actor": placement, **more}}


def kv(name: str, k: bytes) -> bytes | None:
    return internal_kv._internal_kv_get(kv_prefix(name) + k, namespace=KV_NAMESPACE)


def kv_put(name: str, k: bytes, v: bytes) -> None:
    internal_kv._internal_kv_put(kv_prefix(name) + k, v, overwrite=True, namespace=KV_NAMESPACE)


def kill_controller(ctl) -> None:
    """Kill the controller's process; Ray restarts it. No call is made to it after."""
    ray.kill(ctl.handle, no_restart=False)


def restore(cluster, count: int = 3) -> None:
    while sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")) < count:
        cluster.add_node(num_cpus=GPUS, num_gpus=GPUS)
    cluster.wait_for_nodes()


def head_id() -> str:
    return next(n.node_id for n in node_infos() if n.alive and n.is_head)


def test_the_controller_lands_on_the_head_in_ten_of_ten_fresh_starts(cluster):
    head = head_id()
    where = []
    for i in range(10):
        ctl = clients.connect(name=f"pin{i}")
        where.append(ctl.health()["node_id"])
        ctl.stop()
    assert where == [head] * 10


def test_a_restarted_controller_repairs_a_lost_node_with_no_call(cluster):
    ctl = clients.connect()
    first = ctl.reserve("quiet", spec("0-3"), timeout_s=60)
    lost = first.info.slots[0].node_id
    kill_controller(ctl)
    node = next(n for n in cluster.list_all_nodes() if n.node_id == lost)
    cluster.remove_node(node, allow_graceful=False)  # abrupt: Ray is not told
    # Observe only the GCS table, as a driver's Reservation.refresh() does.
    res = clients.Controller(None).reservation("quiet")
    info = wait_for(
        lambda: (i := res.refresh()).state == "ready" and i.epoch > first.epoch and i,
        timeout=60,
    )
    assert lost not in {s.node_id for s in info.slots}
    assert set(live_groups(ray.get(ctl.handle.group_prefix.remote()) + "quiet:")) == {
        s.group_id for s in info.slots
    }
    ctl.release("quiet")
    restore(cluster)


def test_a_table_from_a_newer_placectl_leaves_every_group_in_place(cluster):
    ctl = clients.connect()
    res = ctl.reserve("future", spec("0-3"), timeout_s=60)
    groups = {s.group_id for s in res.info.slots}
    original = kv("placectl", key(RECORD, "future"))
    bumped = msgspec.msgpack.decode(original)
    bumped["v"] = 99
    kv_put("placectl", key(RECORD, "future"), msgspec.msgpack.encode(bumped))
    kill_controller(ctl)
    wait_for(lambda: _refusal(ctl), timeout=60)
    with pytest.raises(TableUnreadable, match="schema version 99"):
        ctl.list()
    cli = subprocess.run(
        [sys.executable, "-m", "clients.cli", "status", "--address", cluster.address],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert cli.returncode == 6 and "schema version 99" in cli.stderr, cli.stderr  # unavailable
    table = placement_group_table()
    assert {table[g]["state"] for g in groups} == {"CREATED"}  # nothing was removed
    assert kv("placectl", key(RECORD, "future")) == msgspec.msgpack.encode(bumped)
    kv_put("placectl", key(RECORD, "future"), original)  # the operator puts it back
    wait_for(lambda: not _refusal(ctl), timeout=30)
    assert ctl.status("future").state == "ready"
    ctl.release("future")


def _refusal(ctl):
    try:
        return ctl.health()["refusal"]
    except ray.exceptions.RayActorError:
        return None


def test_upgrade_over_a_format_1_table_keeps_every_group(cluster):
    ctl = clients.connect()
    ctl.reserve("old", spec("0-5", rollout="0-5"), timeout_s=60)
    before = ctl.table()
    view = live_view(node_infos(), "GPU")
    # Put the GCS back the way placectl 0.1 left it: one key, no format-2 keys.
    rewrite_as_v1("placectl", v1_table(before, view))
    kill_controller(ctl)
    after = wait_for(lambda: _migrated(ctl), timeout=60)
    assert {j: r.group_ids() for j, r in after.items()} == {
        j: r.group_ids() for j, r in before.items()
    }
    assert all(r.state == "ready" for r in after.values())
    table = placement_group_table()
    assert {table[g]["state"] for r in after.values() for g in r.group_ids()} == {"CREATED"}
    group_on = {s.node_id: s.group_id for s in before["old"].slots}
    for a in ctl.reservation("old").assignments("rollout"):
        assert a.placement_group_id == group_on[a.placement.node_id]
    ctl.release_all()


def _migrated(ctl):
    try:
        table = ctl.table()
    except TableUnreadable:
        return None
    return table or None


@ray.remote(num_cpus=0)
class Bystander:
    """A process with a placectl worker's environment, outside the reservation's groups,
    so that replacing the reservation does not end it."""

    def me(self, strict=False):
        try:
            a = clients.current(strict=strict)
        except StaleReservation as e:
            return f"stale: {e}"
        return a.uid, a.epoch, a.placement.rank


def test_replace_is_seen_by_an_existing_reservation_and_by_current(cluster):
    ctl = clients.connect()
    ctl.reserve("swap", spec("0-3"), timeout_s=60)
    res = ctl.reservation("swap")
    old = res.assignments("actor")
    env = {k: v for k, v in old[1].env.items() if k.startswith(("PLACECTL_", "RANK"))}
    worker = Bystander.options(runtime_env={"env_vars": env}).remote()
    assert ray.get(worker.me.remote()) == (old[1].uid, old[1].epoch, 1)
    ctl.reserve("swap", spec("4-7"), timeout_s=60, replace=True)
    new = res.assignments("actor")  # the same Reservation object
    assert new[1].uid != old[1].uid and new[1].epoch > old[1].epoch
    assert new[1].placement_group_id != old[1].placement_group_id
    assert ray.get(worker.me.remote()) == (new[1].uid, new[1].epoch, 1)
    assert ray.get(worker.me.remote(True)).startswith(
        "stale: swap/actor:1 was started with its assignment of reservation"
    )
    ctl.release("swap")
