"""What a real vLLM engine takes from the reservation, read from the OS: the ports its
processes listen on are inside its rank's lease (two engines on one node: two leases, no
port shared), and each of its workers runs bound to the cores placectl gave it (two
engines: disjoint; tensor parallel 2 in one slot: a core list per worker). And they
generate what transformers generates."""

from __future__ import annotations

import os
import pathlib

import psutil
import pytest

import clients
from clients.testing import tiny_model
from clients.testing.vllm_ranks import Engine, Server
from controller.runtime.edge.node_tasks import alive
from tests.engines.test_vllm import environ

EPHEMERAL = pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range")
TWO_ENGINES = {
    "num_nodes": 2,
    "component_placement": {"rollout": {"placement": "0-1", "engine": "vllm"}},
}


def one_engine_on(gpu: int) -> dict:
    return {
        "num_nodes": 2,
        "component_placement": {"rollout": {"placement": str(gpu), "engine": "vllm"}},
    }


ONE_ENGINE_OF_TWO_WORKERS = {  # one rank holding both accelerators of the node
    "num_nodes": 2,
    "component_placement": {"rollout": {"placement": "0-1:0", "engine": "vllm"}},
}


def listening(pid: int) -> set[int]:
    try:
        conns = psutil.Process(pid).net_connections(kind="inet")
    except psutil.NoSuchProcess:
        return set()
    return {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}


def id_list(text: str) -> list[int]:
    """``"0-2,5"`` as the kernel and vLLM write core lists: [0, 1, 2, 5]."""
    cores = []
    for part in text.strip().split(","):
        low, _, high = part.partition("-")
        cores += range(int(low), int(high or low) + 1)
    return cores


def allowed_cores(pid: int, tid: int | None = None) -> list[int]:
    """The cores the OS lets one thread of the process (default its main one) run on."""
    with open(f"/proc/{pid}/task/{tid or pid}/status") as f:
        line = next(x for x in f if x.startswith("Cpus_allowed_list:"))
    return id_list(line.split(":", 1)[1])


def every_threads_cores(pid: int) -> set[int]:
    """The cores any thread of the process may run on, read from the OS."""
    tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    return set().union(*(allowed_cores(pid, t) for t in tids))


def workers(tree: list[dict]) -> list[dict]:
    return sorted(
        (p for p in tree if p["name"].startswith("VLLM::Worker")), key=lambda p: p["name"]
    )


@pytest.fixture
def reserve(ctl):
    jobs = []

    def make(job, config):
        jobs.append(job)
        return ctl.reserve(job, config, timeout_s=120)

    yield make
    for job in jobs:
        ctl.release(job)


def test_two_engines_on_one_node_listen_on_their_own_leases_and_bind_their_own_cores(
    reserve, ctl, models
):
    res = reserve("two-engines", TWO_ENGINES)
    group = clients.WorkerGroup.launch(res, "rollout", Engine, str(models[0]))
    try:
        want = tiny_model.greedy(models[0])
        assert group.execute("generate") == [want, want]
        trees = group.execute("tree")
        (node,) = {a.placement.node_id for a in res.assignments("rollout")}  # one node
        leases = {
            x.rank: set(x.ports)
            for x in ctl.record("two-engines").leases
            if x.purpose.endswith(f"engine@{node}")
        }
        assert sorted(leases) == [0, 1] and not leases[0] & leases[1]
        low, high = map(int, EPHEMERAL.read_text().split())
        seen, heard = [], []
        for rank, tree in enumerate(trees):
            for p in tree:  # what WorkerGroup set, as each engine process has it
                assert int(environ(p["pid"])["VLLM_PORT"]) == min(leases[rank]), p
            ports = set().union(*(listening(p["pid"]) for p in tree))
            assert ports, f"rank {rank}'s engine listens on no port: {tree}"
            # vLLM 0.32's CPU engine takes the ports of its own process groups from the
            # kernel (its ephemeral range, where no lease is) and its fixed ones upward
            # from VLLM_PORT: none is another engine's.
            mine = {x for x in ports if not low <= x <= high}
            assert mine <= leases[rank], (rank, sorted(ports), sorted(leases[rank]))
            heard.append(ports)
            (worker,) = workers(tree)
            seen.append(allowed_cores(worker["pid"]))
        assert not heard[0] & heard[1]
        assert not set(seen[0]) & set(seen[1]), seen
        binds = [s["bind"]["VLLM_CPU_OMP_THREADS_BIND"] for s in group.execute("started")]
        assert seen == [id_list(b) for b in binds]
    finally:
        group.shutdown()


def test_a_tensor_parallel_engine_binds_each_worker_to_its_own_cores(reserve, models):
    res = reserve("two-workers", ONE_ENGINE_OF_TWO_WORKERS)
    group = clients.WorkerGroup.launch(
        res, "rollout", Engine, str(models[0]), tensor_parallel_size=2
    )
    try:
        assert group.execute("generate") == [tiny_model.greedy(models[0])]
        (tree,) = group.execute("tree")
        pair = workers(tree)
        assert len(pair) == 2, tree
        cores = [allowed_cores(p["pid"]) for p in pair]
        assert not set(cores[0]) & set(cores[1]), cores
        (started,) = group.execute("started")
        lists = started["bind"]["VLLM_CPU_OMP_THREADS_BIND"].split("|")
        assert cores == [id_list(x) for x in lists]
    finally:
        group.shutdown()


def test_engines_of_two_reservations_on_one_node_bind_disjoint_cores(reserve, ctl, models):
    """Each reservation's engine is its component's only process on the node: split by
    the component alone, both took every core. Their core leases keep them apart, for
    every thread of each engine worker."""
    groups = []
    try:
        for job, gpu in (("engine-a", 0), ("engine-b", 1)):
            res = reserve(job, one_engine_on(gpu))
            groups.append(clients.WorkerGroup.launch(res, "rollout", Engine, str(models[0])))
        (a,), (b,) = (g.reservation.assignments("rollout") for g in groups)
        assert a.placement.node_id == b.placement.node_id  # one node, two reservations
        want = tiny_model.greedy(models[0])
        seen = []
        for group in groups:
            assert group.execute("generate") == [want]
            ((worker,),) = (workers(tree) for tree in group.execute("tree"))
            seen.append(every_threads_cores(worker["pid"]))
        assert seen[0] and seen[1] and not seen[0] & seen[1], seen
        units = [ctl.record(job).cores for job in ("engine-a", "engine-b")]
        assert [len(u) for u in units] == [1, 1] and units[0][0].first != units[1][0].first
    finally:
        for group in groups:
            group.shutdown()


def test_two_engine_servers_on_one_node_listen_on_their_leased_ports(reserve, ctl, models):
    """vLLM's OpenAI server takes its port as an argument: each rank's comes from a lease
    of its own on the node (``PLACECTL_SERVER_PORT``). Read from the OS: each server
    process listens on its rank's leased port, the two ports differ, each answers a
    completion with transformers' greedy text, and shutdown() leaves neither server
    (each in a session of its own, as engines start theirs)."""
    from transformers import AutoTokenizer

    res = reserve("two-servers", TWO_ENGINES)
    group = clients.WorkerGroup.launch(res, "rollout", Server, str(models[0]), timeout=600)
    served = group.execute("served")
    try:
        (node,) = {a.placement.node_id for a in res.assignments("rollout")}
        leased = {
            x.rank: x.ports
            for x in ctl.record("two-servers").leases
            if x.purpose.endswith(f"server@{node}")
        }
        assert sorted(leased) == [0, 1]
        assert [s["port"] for s in served] == [leased[0][0], leased[1][0]]
        assert leased[0] != leased[1]
        for s in served:
            assert s["port"] in listening(s["pid"]), (s, listening(s["pid"]))
        text = AutoTokenizer.from_pretrained(models[0]).decode(
            tiny_model.greedy(models[0]), skip_special_tokens=True
        )
        for answer in group.execute("complete", str(models[0])):
            assert answer["usage"]["completion_tokens"] == tiny_model.TOKENS
            assert answer["choices"][0]["text"] == text
    finally:
        group.shutdown()
    assert not [s for s in served if alive(s["pid"])], served
