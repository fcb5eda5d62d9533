"""Warm standby on a real local cluster: the reservation holds a spare node, a worker
group keeps standby processes there, and a node lost abruptly is repaired by promoting
them: no process starts. Read from the processes themselves (their pids, their
``os.environ``, Ray's runtime context in them, a gloo group formed from their
environment alone), never from placectl's records."""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import os
import time

import pytest
import ray

import clients
import clients.engines
from clients.verdict import actor_dead
from tests.integration.conftest import (
    held_spare,
    live_groups,
    local_cluster,
    placectl_cli,
    remove,
    wait_for,
)

JOB = "standby"
CONF = {
    "num_nodes": 2,  # head + one node of 4 GPUs
    "spares": 1,
    "component_placement": {"actor": {"placement": "0-3", "standby": True}},
}
LOAD_S = 10.0  # the constructor's model load, stood in for (scripts/bench/bench_standby.py)


@pytest.fixture(scope="module")
def cluster():
    """Head (no GPUs) + three nodes of 4 fake GPUs: the job's, a held spare, and one
    held after the first is taken."""
    yield from local_cluster(gpu_nodes=3)


class Worker:
    def __init__(self) -> None:
        time.sleep(LOAD_S)
        self.promoted_with: dict | None = None
        self.promotions = 0

    def on_promote(self, env: dict) -> None:
        self.promoted_with = env
        self.promotions += 1

    def seen(self) -> dict:
        """What this process is, as Ray and its own environment say."""
        ctx = ray.get_runtime_context()
        keys = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PLACECTL_STANDBY")
        return {
            "pid": os.getpid(),
            "node": ctx.get_node_id(),
            "group": ctx.get_placement_group_id(),
            "gpus": [int(g) for g in ray.get_gpu_ids()],
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "env": {k: os.environ.get(k) for k in keys},
            "promoted": self.promoted_with is not None,
            "promotions": self.promotions,
        }

    def leave(self) -> None:
        """Destroy this rank's process group (rank 0's: its store with it)."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    def all_reduce(self, generation: int) -> float:
        import torch
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        timeout = datetime.timedelta(seconds=30)
        dist.init_process_group("gloo", init_method="env://", timeout=timeout)
        t = torch.tensor([float(int(os.environ["RANK"]) + 1)])
        dist.all_reduce(t)
        return t.item()


def standbys_on(group, node: str, timeout: float = 60.0, count: int = 4) -> list[dict]:
    """The standbys, each as it sees itself, once ``count`` run on ``node``."""

    def seen():
        group.refill_standbys()
        found = ray.get([a.seen.remote() for a in group.standbys], timeout=timeout)
        return len(found) == count and all(s["node"] == node for s in found) and found

    return wait_for(seen, timeout=timeout)


def standby_status(cluster) -> list[str]:
    """What ``placectl status JOB`` says of the actor component's standbys."""
    done = placectl_cli(cluster.address, "status", JOB, "--output", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["standbys"]["actor"]


def test_a_lost_node_is_repaired_by_promoting_its_standbys_twice(cluster):
    ctl = clients.connect()
    res = ctl.reserve(JOB, CONF, timeout_s=60)
    try:
        job_node = res.refresh().slots[0].node_id
        spare = held_spare(res)
        assert spare != job_node
        assert standby_status(cluster) == ["missing"] * 4  # no group runs any yet
        # A driver's own group (not detached): its standbys are seen from another process
        # (the command line), and after its shutdown their names serve a new group.
        own = clients.WorkerGroup.launch(res, "actor", Worker)
        assert {s["node"] for s in standbys_on(own, spare)} == {spare}
        assert standby_status(cluster) == ["ready"] * 4
        own.shutdown()
        group = clients.WorkerGroup.launch(res, "actor", Worker, detached=True)
        waiting = standbys_on(group, spare)
        for s in waiting:
            # A standby has its bundle's device, and no rank to join a collective as.
            assert s["env"]["PLACECTL_STANDBY"] == "1" and s["env"]["RANK"] is None
            assert s["env"]["MASTER_ADDR"] is None and len(s["gpus"]) == 1
            assert s["visible"] == str(s["gpus"][0])
        assert ray.get([a.all_reduce.remote(0) for a in group.actors]) == [10.0] * 4

        for lost_node, standing in ((job_node, waiting), (spare, None)):
            if standing is None:  # the second loss: the spare held since the first
                nxt = held_spare(res)
                standing = standbys_on(group, nxt)
            pids = {s["pid"] for s in standing}
            remove(cluster, lost_node)
            started = time.monotonic()
            assert group.repair(timeout=120) == [0, 1, 2, 3]
            took = time.monotonic() - started
            ranks = ray.get([a.seen.remote() for a in group.actors])
            # The standbys are the ranks: the same processes, no new one started.
            assert {r["pid"] for r in ranks} == pids, (ranks, standing)
            for r, seen in enumerate(ranks):
                assert seen["env"]["RANK"] == str(r) and seen["env"]["WORLD_SIZE"] == "4"
                assert seen["env"]["PLACECTL_STANDBY"] is None and seen["promoted"]
                assert seen["node"] != lost_node
            # The environment alone forms the group again, on the promoted processes.
            assert ray.get([a.all_reduce.remote(1) for a in group.actors]) == [10.0] * 4
            # No rank started: faster than one start (stated 1.24 s, bench_standby.py).
            assert took < LOAD_S, took

        # A new driver finds the promoted ranks by name.
        again = clients.WorkerGroup.attach(res, "actor", Worker)
        assert [ray.get(a.seen.remote())["pid"] for a in again.actors] == [r["pid"] for r in ranks]
        group.shutdown()
    finally:
        ctl.release(JOB)
    assert not [g for g, i in live_groups().items() if f":{JOB}:" in (i.get("name") or "")]


class Engine:
    """Binds what a vLLM engine binds when it starts: its ``VLLM_PORT`` (listening) and
    its cores (``VLLM_CPU_OMP_THREADS_BIND``, from the node's leased units)."""

    def __init__(self) -> None:
        import socket

        os.environ.update(clients.engines.vllm_environment(1))
        self.sock = socket.socket()
        self.sock.bind(("0.0.0.0", int(os.environ["VLLM_PORT"])))
        self.sock.listen()

    def seen(self) -> dict:
        return {
            "pid": os.getpid(),
            "node": ray.get_runtime_context().get_node_id(),
            "listening": self.sock.getsockname()[1],  # the OS's word
            "units": os.environ["PLACECTL_CPU_UNITS"],
            "bind": os.environ["VLLM_CPU_OMP_THREADS_BIND"],
            "rank": os.environ.get("RANK"),
        }


def test_a_standby_engine_listens_on_its_spares_leases_and_keeps_them_as_the_rank(cluster):
    """An engine's standbys start on ports and cores leased on the held spare; promoted,
    those are their ranks' leases: the same process listens, and no lease on the node
    is given its port or its cores."""
    cluster.add_node(num_cpus=4, num_gpus=4)  # the first test left one GPU node
    cluster.wait_for_nodes()
    comps = {"rollout": {"placement": "0-1", "engine": "vllm", "standby": True}}
    ctl = clients.connect()
    res = ctl.reserve("engines", {"num_nodes": 2, "spares": 1, "component_placement": comps})
    try:
        job_node, spare = res.refresh().slots[0].node_id, held_spare(res)
        group = clients.WorkerGroup.launch(res, "rollout", Engine, detached=True)
        standing = standbys_on(group, spare, count=2)
        ranks_before = ray.get([a.seen.remote() for a in group.actors])
        ports = [s["listening"] for s in standing]
        assert len({*ports, *(r["listening"] for r in ranks_before)}) == 4
        # Their own runs of the spare's CPU units (a machine of fewer cores than units
        # maps two runs onto one core: compare the units).
        assert len({s["units"] for s in standing}) == 2 and all(s["rank"] is None for s in standing)

        remove(cluster, job_node)
        assert group.repair(timeout=120) == [0, 1]
        ranks = ray.get([a.seen.remote() for a in group.actors])
        assert sorted(r["pid"] for r in ranks) == sorted(s["pid"] for s in standing)
        for r, seen in enumerate(ranks):
            assert seen["rank"] == str(r) and seen["node"] == spare
            # The rank's own leases, by the names a relaunch of it would ask, are the
            # ones the promoted process listens on and binds.
            node = seen["node"]
            assert res.lease_ports("rollout", r, 16, True, f"engine@{node}")[0] == seen["listening"]
            units = res.lease_cores("rollout", r, f"cores@{node}")
            assert f"{units['first']}-{units['first'] + units['count'] - 1}" == seen["units"]
        fresh = res.lease_ports("rollout", 0, 16, True, "another")
        assert not set(fresh) & {r["listening"] for r in ranks}
        group.shutdown()
    finally:
        ctl.release("engines")


def test_more_losses_than_standbys_promote_those_there_are_and_start_the_rest(cluster):
    """Two of the job's nodes die at once and the held spare runs standbys for one: those
    are promoted, the other node's ranks start on a free node, and all form one group."""
    for _ in range(3):  # the tests before left one GPU node
        cluster.add_node(num_cpus=4, num_gpus=4)
    cluster.wait_for_nodes()
    comps = {"actor": {"placement": "0-7", "standby": True}}
    ctl = clients.connect()
    res = ctl.reserve("losses", {"num_nodes": 3, "spares": 1, "component_placement": comps})
    try:
        job_nodes = {a.placement.node_id for a in res.assignments("actor")}
        spare = held_spare(res)
        group = clients.WorkerGroup.launch(res, "actor", Worker, detached=True)
        standing = {s["pid"] for s in standbys_on(group, spare)}
        for node in job_nodes:
            remove(cluster, node)
        assert group.repair(timeout=180) == list(range(8))
        ranks = ray.get([a.seen.remote() for a in group.actors], timeout=60)
        promoted = [r for r, s in enumerate(ranks) if s["pid"] in standing]
        assert len(promoted) == 4 and all(ranks[r]["promoted"] for r in promoted)
        started = [s for r, s in enumerate(ranks) if r not in promoted]
        assert not any(s["promoted"] for s in started)
        assert {s["node"] for s in started}.isdisjoint(job_nodes | {spare})
        for r, seen in enumerate(ranks):
            assert seen["env"]["RANK"] == str(r) and seen["env"]["WORLD_SIZE"] == "8"
        # The promoted and the started form one group from their environment alone.
        assert ray.get([a.all_reduce.remote(1) for a in group.actors]) == [36.0] * 8
        group.shutdown()
    finally:
        ctl.release("losses")


def test_standbys_left_unpromoted_by_a_dead_driver_are_promoted_once_by_racing_drivers(cluster):
    """The job's node is lost while no driver runs: the controller makes the held spare
    the slot, and nobody promotes the standbys there. Two new drivers attach at once and
    repair at once: neither takes an unpromoted standby for its rank (each is attached
    as a standby, its rank lost), both promote the same processes, and each promotion
    runs once (the second sees the first). A standby that crashes later is replaced at
    the next refill. Read from the processes: their pids, env and on_promote calls."""
    for _ in range(3):  # the job's node, the held spare, the spare held after it
        cluster.add_node(num_cpus=4, num_gpus=4)
    cluster.wait_for_nodes()
    ctl = clients.connect()
    res = ctl.reserve("orphan", CONF, timeout_s=60)
    try:
        job_node, spare = res.refresh().slots[0].node_id, held_spare(res)
        first = clients.WorkerGroup.launch(res, "actor", Worker, detached=True)
        standing = {s["pid"] for s in standbys_on(first, spare)}
        del first  # the driver is gone: its detached ranks and standbys live on
        remove(cluster, job_node)
        wait_for(
            lambda: (i := res.refresh()).state == "ready" and i.slots[0].node_id == spare,
            timeout=120,
        )
        groups = [clients.WorkerGroup.attach(res, "actor", Worker) for _ in range(2)]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            repaired = list(pool.map(lambda g: g.repair(timeout=120), groups))
        assert repaired == [[0, 1, 2, 3]] * 2
        for group in groups:
            ranks = ray.get([a.seen.remote() for a in group.actors], timeout=60)
            assert {r["pid"] for r in ranks} == standing  # promoted, nothing started
            for r, seen in enumerate(ranks):
                assert seen["env"]["RANK"] == str(r) and seen["env"]["PLACECTL_STANDBY"] is None
                assert seen["promotions"] == 1  # the second promotion changed nothing
        assert ray.get([a.all_reduce.remote(2) for a in groups[0].actors]) == [10.0] * 4

        group = groups[0]
        nxt = held_spare(res)  # the controller holds the next free node as the spare
        before = {s["pid"] for s in standbys_on(group, nxt)}
        victim = group.standbys[0]
        ray.kill(victim, no_restart=True)  # a standby crashes
        wait_for(lambda: actor_dead(victim), timeout=60)  # Ray's table says so
        after = {s["pid"] for s in standbys_on(group, nxt)}  # refill_standbys() each look
        assert len(after) == 4 and len(after - before) == 1
        for g in groups:
            g.shutdown()
    finally:
        ctl.release("orphan")


def test_a_lost_node_of_fewer_ranks_is_repaired_on_the_spare_of_a_fuller_one(cluster):
    """GPUs 0-5 on nodes of 4: node rank 1 holds ranks 0-3, node rank 2 ranks 4 and 5, and
    the held spare copies the fuller node (standbys for four ranks). Node rank 2 dies
    abruptly with every other node taken (a plain Ray placement group holds them): its
    ranks go to the spare, where two standbys become ranks 4 and 5, each on the device
    Ray gives its bundle, and the six form one group from their environment alone. The
    spare used to fit only a node of its very shape: the repair waited for a node."""
    for _ in range(3):  # the job's two nodes and the held spare
        cluster.add_node(num_cpus=4, num_gpus=4)
    cluster.wait_for_nodes()
    head = cluster.head_node.node_id
    ctl = clients.connect()
    comps = {"actor": {"placement": "0-5", "standby": True}}
    res = ctl.reserve("fewer", {"num_nodes": 3, "spares": 1, "component_placement": comps})
    filler = None
    try:
        spare = held_spare(res)
        slots = {s.node_rank: s.node_id for s in res.refresh().slots}
        others = {n.node_id for n in cluster.list_all_nodes()} - {head, spare, *slots.values()}
        alive = lambda: {n["NodeID"] for n in ray.nodes() if n["Alive"]} - {head}  # noqa: E731
        wait_for(lambda: alive() == others | {spare, *slots.values()}, timeout=60)
        if others:  # the nodes earlier tests left free: taken, as another job would
            filler = ray.util.placement_group(
                [{"GPU": 4}] * len(others), strategy="STRICT_SPREAD", name="fewer-filler"
            )
            ray.get(filler.ready(), timeout=60)
        group = clients.WorkerGroup.launch(res, "actor", Worker, detached=True)
        standing = {s["pid"] for s in standbys_on(group, spare)}
        assert ray.get([a.all_reduce.remote(0) for a in group.actors]) == [21.0] * 6
        remove(cluster, slots[2])
        assert group.repair(timeout=120) == [4, 5]
        ranks = ray.get([a.seen.remote() for a in group.actors], timeout=60)
        table = ray.util.placement_group_table()
        (kept,) = [s for s in res.refresh().slots if s.node_rank == 2]
        assert kept.node_id == spare and table[kept.group_id]["state"] == "CREATED"
        for r in (4, 5):
            seen = ranks[r]
            assert seen["pid"] in standing and seen["promoted"], seen  # no process started
            assert (seen["node"], seen["group"]) == (spare, kept.group_id)
            assert seen["env"]["RANK"] == str(r) and seen["env"]["PLACECTL_STANDBY"] is None
            assert len(seen["gpus"]) == 1 and seen["visible"] == str(seen["gpus"][0])
        # Every rank leaves the old group before any joins the new one, as a job does:
        # rank 0 kept its master address and port, and a rank joining meanwhile reached
        # the old group's store as rank 0 closed it (gloo: "Failed to recv").
        ray.get([a.leave.remote() for a in group.actors])
        assert ray.get([a.all_reduce.remote(1) for a in group.actors]) == [21.0] * 6
        group.shutdown()
    finally:
        ctl.release("fewer")
        if filler is not None:
            ray.util.remove_placement_group(filler)
