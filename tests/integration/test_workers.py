"""Worker groups and the worker environment on a real local cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest
import ray

import clients
from controller import PlacementError
from tests.integration.conftest import GPU_NODES, one_node

COLOCATED = {
    "num_nodes": 1 + GPU_NODES,
    "component_placement": {
        "actor,rollout": "0-5",  # GPUs 6-7 stay free for other jobs
        "engine": {"placement": "0-5:0-2", "capture_child_tasks": True},
        "probe": {"placement": "0-3:0-1", "isolate": False, "accelerator_share": 0.1},
    },
}
CONTRACT = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
    "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",
    "PLACECTL_JOB",
    "PLACECTL_COMPONENT",
    "PLACECTL_EPOCH",
    "PLACECTL_NODE_GROUP",
)


@ray.remote(num_cpus=0)
def _child_group():
    return ray.get_runtime_context().get_placement_group_id()


class Worker:
    def __init__(self, greeting="hi"):
        self.greeting = greeting

    def environ(self):
        return dict(os.environ)

    def gpus(self):
        return sorted(int(g) for g in ray.get_gpu_ids())

    def hello(self):
        return f"{self.greeting} from {os.environ['RANK']}"

    def me(self):
        return clients.current()

    def child_group(self):
        return ray.get(_child_group.remote())

    def own_group(self):
        return ray.get_runtime_context().get_placement_group_id()

    def all_reduce(self):
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")  # env:// — MASTER_ADDR/PORT, RANK, WORLD_SIZE
        value = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(value)
        dist.destroy_process_group()
        return value.item()


@pytest.fixture(scope="module")
def res(ctl):
    reservation = ctl.reserve("workers", COLOCATED, timeout_s=60)
    yield reservation
    ctl.release("workers")


@pytest.fixture(autouse=True)
def _clean():  # keep the module's reservation between tests
    yield


def test_every_worker_environment_is_what_its_assignment_promised(res):
    for component in ("actor", "engine", "probe"):
        group = clients.WorkerGroup.launch(res, component, Worker, env={"MY_FLAG": "1"})
        try:
            seen = group.execute("environ")
            for a, env in zip(res.assignments(component), seen, strict=True):
                for key in CONTRACT:
                    assert env[key] == a.env[key], (component, key)
                assert env["MY_FLAG"] == "1"
                assert env["PLACECTL_COMPONENT"] == component
            assert group.execute("me") == res.assignments(component)
        finally:
            group.shutdown()


def test_gloo_all_reduce_across_two_nodes(res):
    assignments = res.assignments("actor")
    assert len({a.placement.node_id for a in assignments}) == 2
    group = clients.WorkerGroup.launch(res, "actor", Worker)
    try:
        n = len(assignments)
        assert group.execute("all_reduce") == [n * (n + 1) / 2] * n
    finally:
        group.shutdown()


def test_master_ports_differ_across_components_and_jobs_and_lie_in_range(ctl, res):
    cpu_only = {
        "num_nodes": 1 + GPU_NODES,
        "component_placement": {"svc": {"node_group": "node", "placement": 0}},
    }
    other = ctl.reserve("workers-2", cpu_only, timeout_s=30)
    try:
        ports = [res.assignments(c)[0].env["MASTER_PORT"] for c in res.components]
        ports.append(other.assignments("svc")[0].env["MASTER_PORT"])
        assert len(set(ports)) == len(ports)
        assert all(20000 <= int(p) <= 29999 for p in ports)
        for c in res.components:  # every rank of a component shares rank 0's address
            envs = [a.env for a in res.assignments(c)]
            assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1
    finally:
        ctl.release("workers-2")


def test_concurrent_port_leases_never_collide(res):
    got: list[list[int]] = []
    lock = threading.Lock()

    def lease():
        ports = res.lease_ports("engine", rank=1, count=3, consecutive=True)
        with lock:
            got.append(ports)

    threads = [threading.Thread(target=lease) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [p for ports in got for p in ports]
    assert len(got) == 12 and len(flat) == len(set(flat)) == 36
    assert all(ports == list(range(ports[0], ports[0] + 3)) for ports in got)
    masters = {int(res.assignments(c)[0].env["MASTER_PORT"]) for c in res.components}
    assert not masters & set(flat)
    assert res.lease_ports("engine", 1, 2, name="kv") == res.lease_ports("engine", 1, 2, name="kv")
    assert res.release_ports(flat) == 12


def test_port_lease_errors(res):
    with pytest.raises(PlacementError, match="count 0: must be 1-1024"):
        res.lease_ports("engine", 0, 0)
    with pytest.raises(PlacementError, match="rank 9 of 'engine': out of range"):
        res.lease_ports("engine", 9, 1)
    with pytest.raises(PlacementError, match="unknown component 'nope'"):
        res.lease_ports("nope", 0, 1)


def test_child_task_capture_per_component(res):
    engine = clients.WorkerGroup.launch(res, "engine", Worker)  # capture_child_tasks: true
    actor = clients.WorkerGroup.launch(res, "actor", Worker)  # capture off (default)
    try:
        for own, child in zip(
            engine.execute("own_group"), engine.execute("child_group"), strict=True
        ):
            assert own is not None and child == own
        assert actor.execute_rank(0, "own_group") is not None
        assert actor.execute_rank(0, "child_group") is None
    finally:
        engine.shutdown()
        actor.shutdown()


def test_multi_accelerator_process_sees_its_whole_list(res):
    group = clients.WorkerGroup.launch(res, "engine", Worker)
    try:
        for a, env in zip(res.assignments("engine"), group.execute("environ"), strict=True):
            devices = [int(d) for d in env["CUDA_VISIBLE_DEVICES"].split(",")]
            assert devices == a.placement.cuda_visible_devices and len(devices) == 2
        # isolate: false shows every GPU the component holds on the node
        probe = res.assignments("probe")
        assert [a.placement.cuda_visible_devices for a in probe] == [
            probe[0].placement.cuda_visible_devices
        ] * 2
        assert len(probe[0].placement.cuda_visible_devices) == 4
        assert [a.env["LOCAL_RANK"] for a in probe] == ["0", "2"]  # index of its first GPU
    finally:
        group.shutdown()


def test_protected_keys_cannot_be_overridden(res):
    with pytest.raises(PlacementError, match="env sets CUDA_VISIBLE_DEVICES, RANK"):
        clients.WorkerGroup.launch(
            res, "actor", Worker, env={"RANK": "5", "CUDA_VISIBLE_DEVICES": "0"}
        )
    with pytest.raises(PlacementError, match="actor_options sets num_gpus"):
        clients.WorkerGroup.launch(res, "actor", Worker, actor_options={"num_gpus": 1})
    with pytest.raises(PlacementError, match="env sets MASTER_PORT"):
        clients.WorkerGroup.launch(
            res, "actor", Worker, actor_options={"runtime_env": {"env_vars": {"MASTER_PORT": "1"}}}
        )


def test_shutdown_frees_the_shares_so_the_next_launch_schedules_at_once(ctl, res):
    full = ctl.reserve("full", one_node("6-7", rollout="6-7"), timeout_s=30)
    try:
        assert {a.num_gpus for a in full.assignments("actor")} == {0.5}
        first = clients.WorkerGroup.launch(full, "actor", Worker)
        rollout = clients.WorkerGroup.launch(full, "rollout", Worker)
        ray.get(first.execute_async("hello") + rollout.execute_async("hello"))
        # every bundle is full: another actor group cannot start...
        second = clients.WorkerGroup.launch(full, "actor", Worker)
        ready, _ = ray.wait(second.execute_async("hello"), num_returns=2, timeout=3)
        assert not ready
        # ...until the first one is shut down
        first.shutdown()
        ready, _ = ray.wait(second.execute_async("hello"), num_returns=2, timeout=60)
        assert len(ready) == 2
        second.shutdown()
        rollout.shutdown()
    finally:
        ctl.release("full")


def test_detached_workers_are_reattached_from_a_new_driver(cluster, res):
    group = clients.WorkerGroup.launch(res, "engine", Worker, "hello", detached=True)
    try:
        assert group.execute("hello") == [f"hello from {r}" for r in range(3)]
        script = textwrap.dedent(
            f"""
            import ray, clients
            ray.init(address={cluster.address!r}, logging_level="ERROR", log_to_driver=False)
            res = clients.connect(start=False).reservation("workers")
            group = clients.WorkerGroup.attach(res, "engine")
            print(group.execute("hello"))
            """
        )
        proc = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().splitlines()[-1] == str([f"hello from {r}" for r in range(3)])
    finally:
        group.shutdown()
    with pytest.raises(PlacementError, match=r"no running worker 'workers\.engine\.0'"):
        clients.WorkerGroup.attach(res, "engine")


def test_current_outside_a_worker_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("PLACECTL_JOB", raising=False)
    with pytest.raises(PlacementError, match="not a placectl worker"):
        clients.current()
