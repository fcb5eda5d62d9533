"""Machines that fail as real ones do, on a real local cluster, with the user's calls made
the instant the fault happens: a node killed without a word, a hung node that comes
back after it was given up, a worker killed by the OOM killer, a worker stopped inside
a call, a raylet killed alone. And the converse: a slow worker is not a dead one.

Every verdict is Ray's (its node table, its actor table, what a worker's own runtime
context says), never placectl's record of itself."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import ray

import clients
from clients.testing import machines
from tests.integration.conftest import local_cluster, wait_for

GPUS = 4


@pytest.fixture(scope="module")
def cluster():
    """Head (no GPUs) + three nodes of 4 fake GPUs: two to reserve, one spare."""
    yield from local_cluster(gpu_nodes=3)


class Worker:
    def ping(self):
        ctx = ray.get_runtime_context()
        return {
            "epoch": os.environ["PLACECTL_EPOCH"],
            "pid": os.getpid(),
            "node": ctx.get_node_id(),
            "group": ctx.get_placement_group_id(),
        }

    def spin(self, seconds: float) -> int:
        end = time.time() + seconds
        n = 0
        while time.time() < end:  # holds the GIL all along
            n += 1
        return n

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def spec() -> dict:
    return {"num_nodes": 3, "component_placement": {"actor": "0-7"}}


def ray_node_alive(node_id: str) -> bool:
    return next(n["Alive"] for n in ray.nodes() if n["NodeID"] == node_id)


def ray_death_reason(node_id: str) -> str:
    """Why Ray's node table says the node died."""
    return next(n.get("DeathReasonMessage") or "" for n in ray.nodes() if n["NodeID"] == node_id)


def node_of(cluster, node_id: str):
    return next(n for n in cluster.list_all_nodes() if n.node_id == node_id)


def restore(cluster, count: int = 3) -> None:
    while sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")) < count:
        cluster.add_node(num_cpus=GPUS, num_gpus=GPUS)
    cluster.wait_for_nodes()


def launch(ctl, job: str):
    res = ctl.reserve(job, spec(), timeout_s=120)
    group = clients.WorkerGroup.launch(res, "actor", Worker)
    return res, group, group.execute("ping")


def check_where_ray_says(group, ranks) -> list[dict]:
    """Each rank runs on the node and in the placement group its assignment names, as
    the worker's own runtime context reports them."""
    pings = [group.execute_rank(r, "ping") for r in ranks]
    for r, p in zip(ranks, pings, strict=True):
        a = group.assignments[r]
        assert (p["node"], p["group"]) == (a.placement.node_id, a.placement_group_id)
    return pings


# An abruptly dead node dead in Ray's table after placectl's fence, and repair() back,
# as docs/evidence/benchmarks.md states them (about 1.5 s and 3.4-4.1 s; Ray alone
# notices in 16 s and more), bounded for 2 loaded cores.
DEAD_S = 5.0
REPAIR_S = 10.0
# Figures the docs state, measured alone as they measured them: beside another lane's
# busy cluster repair() took 17.0 s, and the module's later tests lacked the node it lost.
pytestmark = pytest.mark.alone


# Every time, not most times: a race between the death and the call shows only some of
# the time. Three ways a machine dies without a word: every process killed by signal
# (rank 0's node), Ray's own abrupt removal (rank 4's node), and the same with a user who
# looks a second later, who must get the same answer (rank 0's node again). The same
# flow runs in test_secured twice, in the RLinf, OpenRLHF and training-job tests, and on
# the fake cluster in the unit tests.
@pytest.mark.parametrize(
    ("how", "rank", "delay"), [("crash", 0, 0.0), ("remove", 4, 0.0), ("remove", 0, 1.0)]
)
def test_abrupt_node_death_repair_at_once_relaunches_exactly_the_lost_ranks(
    cluster, ctl, how, rank, delay
):
    res, group, before = launch(ctl, "abrupt")
    epoch = res.epoch
    victim = before[rank]["node"]
    on_victim = [r for r, p in enumerate(before) if p["node"] == victim]
    dead_at: list[float] = []

    def until_dead() -> None:  # Ray's own table, not placectl's record
        while ray_node_alive(victim):
            time.sleep(0.05)
        dead_at.append(time.monotonic())

    watch = threading.Thread(target=until_dead, daemon=True)
    started = time.monotonic()
    watch.start()
    if how == "crash":
        machines.crash(cluster, node_of(cluster, victim))
        # As when a machine loses power: its workers are gone with it, at once, not a
        # second later when they would notice their raylet is (read from the kernel).
        assert machines.alive(before[r]["pid"] for r in on_victim) == []
    else:
        cluster.remove_node(node_of(cluster, victim), allow_graceful=False)
    if delay:
        time.sleep(delay)
    else:
        assert ray_node_alive(victim)  # Ray has not noticed yet: the case that matters
    relaunched = group.repair(timeout=60)
    took = time.monotonic() - started
    watch.join(60)
    assert relaunched == on_victim == [rank + i for i in range(4)], relaunched
    assert not ray_node_alive(victim)  # fenced through Ray, not only in placectl
    # placectl's verdict, not Ray's own (whose health checks take 15 s and more)
    assert "placectl fenced the node" in ray_death_reason(victim)
    assert dead_at and dead_at[0] - started < DEAD_S, dead_at
    assert took < REPAIR_S + delay, took
    assert res.epoch > epoch and res.state == "ready"
    assert victim not in {s.node_id for s in res.info.slots}
    after = check_where_ray_says(group, range(8))
    assert all(p["node"] != victim for p in after)
    kept = [r for r in range(8) if r not in on_victim]
    assert [after[r]["pid"] for r in kept] == [before[r]["pid"] for r in kept]
    group.shutdown()
    ctl.release("abrupt")
    restore(cluster)


def test_a_slow_worker_is_never_relaunched(cluster, ctl):
    res, group, before = launch(ctl, "slow")
    # Busy past the probe's 5 s window (repair() decides about 6 s from here), by 4 s.
    busy = [group.actors[0].spin.remote(10), group.actors[1].sleep.remote(10)]
    time.sleep(1.0)  # both are inside their calls
    assert group.repair(hung_after=5, timeout=60) == []
    assert ray.get(busy)[0] > 0
    assert [p["pid"] for p in group.execute("ping")] == [p["pid"] for p in before]
    assert {s.node_id for s in res.refresh().slots} == {s.node_id for s in res.info.slots}
    assert ctl.health()["fenced"].keys().isdisjoint({p["node"] for p in before})
    group.shutdown()


def test_a_hung_node_moves_its_ranks_and_comes_back_free_with_nothing_of_them(cluster, ctl):
    """Every process of a node stopped (a hung kernel): its raylet is silent to the
    controller and to the witnesses, so the node is suspected, its slot moves and
    repair() relaunches its ranks at once; the node is kept, not fenced (a hang shorter
    than Ray's own detection may end). It comes back: nothing of the moved ranks runs
    there any more, and it is alive in Ray with the same raylet, its GPUs free again."""
    res, group, before = launch(ctl, "hung")
    victim = before[4]["node"]
    node = node_of(cluster, victim)
    procs = machines.hang(node)
    started = time.monotonic()
    relaunched = group.repair(timeout=60)
    took = time.monotonic() - started
    assert relaunched == [4, 5, 6, 7]
    assert took < 30, took
    assert ray_node_alive(victim) and victim not in ctl.health()["fenced"]  # kept
    check_where_ray_says(group, range(8))
    moved = [before[r]["pid"] for r in relaunched]
    machines.resume(node, procs)  # back
    assert machines.wait_gone(moved, timeout=60) == []  # nothing of them survives there
    wait_for(lambda: victim not in ctl.health()["doubts"], timeout=60)  # healthy again
    assert ray_node_alive(victim) and not machines.reap(node)  # the same raylet runs on
    free = ray._private.state.available_resources_per_node
    wait_for(lambda: free().get(victim, {}).get("GPU", 0) == GPUS, timeout=60)
    assert victim not in {s.node_id for s in res.refresh().slots}
    assert group.repair() == []
    group.shutdown()


def test_a_worker_killed_by_the_oom_killer_is_relaunched_in_its_bundle(cluster, ctl):
    res, group, before = launch(ctl, "oom")
    machines.signal_pid(before[2]["pid"], signal.SIGKILL)
    assert group.repair(timeout=60) == [2]
    after = check_where_ray_says(group, range(8))
    assert after[2]["node"] == before[2]["node"] and after[2]["pid"] != before[2]["pid"]
    assert [p["pid"] for i, p in enumerate(after) if i != 2] == [
        p["pid"] for i, p in enumerate(before) if i != 2
    ]
    assert res.refresh().epoch == res.info.epoch  # the reservation did not change
    group.shutdown()


def test_a_worker_stopped_inside_a_call_is_killed_as_hung_and_replaced(cluster, ctl):
    _res, group, before = launch(ctl, "stall")
    stuck = group.actors[3].sleep.remote(60)
    time.sleep(0.5)
    machines.signal_pid(before[3]["pid"], signal.SIGSTOP)
    started = time.monotonic()
    assert group.repair(hung_after=3, timeout=60) == [3]
    assert time.monotonic() - started >= 3  # it had its time to answer
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(stuck, timeout=30)
    assert machines.wait_gone([before[3]["pid"]]) == []
    after = check_where_ray_says(group, range(8))
    assert after[3]["node"] == before[3]["node"]
    assert ray_node_alive(before[3]["node"])  # a hung worker is not a hung node
    group.shutdown()


def test_a_raylet_killed_alone_loses_its_node(cluster, ctl):
    _res, group, before = launch(ctl, "raylet")
    victim = before[0]["node"]
    node = node_of(cluster, victim)
    machines.kill_raylet(node)
    assert group.repair(timeout=60) == [0, 1, 2, 3]
    assert not ray_node_alive(victim)
    after = check_where_ray_says(group, range(8))
    assert all(p["node"] != victim for p in after)
    assert machines.wait_gone([before[r]["pid"] for r in range(4)]) == []
    cluster.remove_node(node, allow_graceful=False)
    group.shutdown()
    restore(cluster)


def test_a_driver_attached_after_two_moves_finds_each_ranks_live_process(cluster, ctl):
    """Faults in combination, names: a node hangs (its ranks relaunched elsewhere under a
    relaunch's name while their old processes live on there, Ray calling them alive),
    then rank 0's node dies (every assignment's epoch moves on). A driver that attaches
    now finds, for each rank, the process Ray runs in the rank's bundle, never the one
    left on the hung node, and its repair() starts nothing."""
    restore(cluster, 4)  # the job's two nodes and two free ones: a move each
    res = ctl.reserve("names", spec(), timeout_s=120)
    group = clients.WorkerGroup.launch(res, "actor", Worker, detached=True)
    before = group.execute("ping")
    hung = node_of(cluster, before[4]["node"])
    procs = machines.hang(hung)
    try:
        assert group.repair(timeout=60) == [4, 5, 6, 7]
        cluster.remove_node(node_of(cluster, before[0]["node"]), allow_graceful=False)
        assert group.repair(timeout=60) == [0, 1, 2, 3]
        running = group.execute("ping")
        attached = clients.WorkerGroup.attach(res, "actor", Worker)
        seen = check_where_ray_says(attached, range(8))  # in each rank's own bundle
        assert [p["pid"] for p in seen] == [p["pid"] for p in running]
        assert attached.repair(timeout=60) == []
        assert ray_node_alive(hung.node_id)  # the stale processes were there to be found
    finally:
        machines.resume(hung, procs)
    group.shutdown()
