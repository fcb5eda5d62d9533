"""Worker groups and the worker environment on a real local cluster, checked against what
Ray and torch do with it: the devices Ray gives each bundle, a torch process group formed
from the environment alone, children started the way inference engines start them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest
import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

import clients
from controller import PlacementError
from tests.integration.conftest import GPU_NODES, bundle_ids, one_node

COLOCATED = {
    "num_nodes": 1 + GPU_NODES,
    "component_placement": {
        "actor,rollout": "0-5",  # GPUs 6-7 stay free for other jobs
        "engine": {"placement": "0-5:0-2", "capture_child_tasks": True},
        "probe": {"placement": "0-3:0-1", "isolate": False, "accelerator_share": 0.1},
    },
}


@ray.remote(num_cpus=0)
def _child_group():
    return ray.get_runtime_context().get_placement_group_id()


@ray.remote(num_cpus=0)
class Child:
    def seen(self):
        ctx = ray.get_runtime_context()
        return {
            "gpus": sorted(int(g) for g in ray.get_gpu_ids()),
            "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "group": ctx.get_placement_group_id(),
            "node": ctx.get_node_id(),
        }


class Worker:
    def __init__(self, greeting="hi", suffix=""):
        self.greeting = greeting + suffix
        self.cleaned = False

    def environ(self):
        return dict(os.environ)

    def ray_gpus(self):
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

    def spawn_children(self):
        """What an engine does: one child per accelerator, through child_options."""
        me = clients.current()
        kids = [
            Child.options(**me.child_options(i)).remote() for i in range(len(me.bundle_indices))
        ]
        ready, _ = ray.wait([k.seen.remote() for k in kids], num_returns=len(kids), timeout=60)
        return [ray.get(r) for r in ready], len(kids)

    def vllm_like_executor(self):
        """What vLLM's Ray executor does with VLLM_RAY_BUNDLE_INDICES: workers in those
        bundles of the current group, each asking VLLM_RAY_PER_WORKER_GPUS, then one
        CUDA_VISIBLE_DEVICES per node made of their ids and a local rank per worker."""
        indices = [int(b) for b in os.environ["VLLM_RAY_BUNDLE_INDICES"].split(",")]
        share = float(os.environ["VLLM_RAY_PER_WORKER_GPUS"])
        pg = ray.util.get_current_placement_group()
        workers = [
            Child.options(
                num_gpus=share,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg,
                    placement_group_capture_child_tasks=True,
                    placement_group_bundle_index=b,
                ),
            ).remote()
            for b in indices
        ]
        seen = ray.get([w.seen.remote() for w in workers], timeout=60)
        by_node: dict[str, list[int]] = {}
        for s in seen:
            by_node.setdefault(s["node"], []).extend(s["gpus"])
        out = []
        for rank, s in enumerate(seen):
            node_workers = [r for r, x in enumerate(seen) if x["node"] == s["node"]]
            local_rank = node_workers.index(rank)
            cvd = sorted(by_node[s["node"]])
            out.append({**s, "device": cvd[local_rank], "bundle": indices[rank]})
        return out

    def cleanup(self):
        with open(os.environ["CLEANUP_FILE"], "a") as f:
            f.write(os.environ["RANK"] + "\n")


@pytest.fixture(scope="module")
def res(ctl):
    reservation = ctl.reserve("workers", COLOCATED, timeout_s=60)
    yield reservation
    ctl.release("workers")


@pytest.fixture(autouse=True)
def _clean():  # keep the module's reservation between tests
    yield


def own_devices(a) -> list[int]:
    """Ray's ids of the devices a process holds, by probing its bundles from the driver."""
    indices = a.bundle_indices
    return [bundle_ids(a.placement_group_id, b)[0] for b in indices]


@pytest.mark.parametrize("component", ["actor", "rollout", "engine", "probe"])
def test_visible_devices_are_what_ray_gave_the_bundles(res, component):
    group = clients.WorkerGroup.launch(res, component, Worker)
    try:
        envs = group.execute("environ")
        assignments = res.assignments(component)
        for a, env in zip(assignments, envs, strict=True):
            visible = [int(d) for d in env["CUDA_VISIBLE_DEVICES"].split(",")]
            if component == "probe":  # isolate: false: all the component's GPUs on its node
                mine = [x for x in assignments if x.placement.node_id == a.placement.node_id]
                assert visible == sorted(d for x in mine for d in own_devices(x))
            else:
                assert visible == own_devices(a)
            # torch's set_device(LOCAL_RANK) selects the process's own first device
            local = int(env["LOCAL_RANK"])
            assert local < len(visible)
            assert visible[local] == own_devices(a)[0]
            assert env["RANK"] == str(a.placement.rank)
            assert env["NODE_LOCAL_RANK"] == str(a.placement.local_rank)
    finally:
        group.shutdown()


def test_isolated_workers_see_their_own_device_through_ray(res):
    group = clients.WorkerGroup.launch(res, "actor", Worker)
    try:
        for a, gpus, env in zip(
            res.assignments("actor"),
            group.execute("ray_gpus"),
            group.execute("environ"),
            strict=True,
        ):
            assert gpus == own_devices(a)  # Ray's own answer inside the worker agrees
            assert env["LOCAL_RANK"] == "0" and env["LOCAL_WORLD_SIZE"] == "1"
            assert env.get("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "") == ""
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


def test_engine_children_land_on_their_own_engines_accelerators(res):
    # the colocated processes hold their shares while the children start
    others = [clients.WorkerGroup.launch(res, c, Worker) for c in ("actor", "rollout", "probe")]
    engine = clients.WorkerGroup.launch(res, "engine", Worker)
    try:
        results = engine.execute("spawn_children")
        for a, (seen, wanted) in zip(res.assignments("engine"), results, strict=True):
            assert len(seen) == wanted == 2  # none waited for room
            expected = own_devices(a)
            assert [s["gpus"] for s in seen] == [[d] for d in expected]
            assert [s["cvd"] for s in seen] == [str(d) for d in expected]
            assert {s["group"] for s in seen} == {a.placement_group_id}
            assert {s["node"] for s in seen} == {a.placement.node_id}
    finally:
        for g in [*others, engine]:
            g.shutdown()


def test_vllm_engine_workers_follow_vllms_variables(ctl):
    conf = {
        "num_nodes": 1 + GPU_NODES,
        "component_placement": {
            "actor,rollout": "6-7",
            "llm": {"placement": "6-7:0", "engine": "vllm"},
        },
    }
    res = ctl.reserve("vllm", conf, timeout_s=60)
    others = [clients.WorkerGroup.launch(res, c, Worker) for c in ("actor", "rollout")]
    llm = clients.WorkerGroup.launch(res, "llm", Worker)
    try:
        (a,) = res.assignments("llm")
        (workers,) = llm.execute("vllm_like_executor")
        expected = own_devices(a)
        assert [w["gpus"] for w in workers] == [[d] for d in expected]
        # the device vLLM computes for each worker is the worker's own
        assert [w["device"] for w in workers] == expected
        assert {w["group"] for w in workers} == {a.placement_group_id}
    finally:
        for g in [*others, llm]:
            g.shutdown()
        ctl.release("vllm")


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


def test_launch_waits_takes_per_rank_arguments_and_shutdown_cleans_up(res, tmp_path):
    marks = tmp_path / "cleanup"
    said: list[str] = []
    group = clients.WorkerGroup.launch(
        res,
        "engine",
        Worker,
        "hello",
        env={"CLEANUP_FILE": str(marks)},
        rank_kwargs=lambda r: {"suffix": f"#{r}"},
        progress=said.append,
    )
    assert group.execute("hello") == [f"hello#{r} from {r}" for r in range(3)]
    group.shutdown(cleanup="cleanup", timeout=30)
    assert sorted(marks.read_text().split()) == ["0", "1", "2"]
    with pytest.raises(PlacementError, match="rank_kwargs has 2 entries"):
        clients.WorkerGroup.launch(res, "engine", Worker, rank_kwargs=[{}, {}])


def test_a_constructor_that_fails_is_named_by_rank(res):
    class Broken:
        def __init__(self):
            if os.environ["RANK"] == "1":
                raise RuntimeError("no model here")

    with pytest.raises(PlacementError, match="rank 1 failed to start"):
        clients.WorkerGroup.launch(res, "engine", Broken, timeout=60)


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
        # every bundle is full: another actor group cannot start...
        second = clients.WorkerGroup.launch(full, "actor", Worker, wait=False)
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


def test_current_inside_a_worker_is_its_assignment(res):
    group = clients.WorkerGroup.launch(res, "engine", Worker)
    try:
        assert group.execute("me") == res.assignments("engine")
    finally:
        group.shutdown()
