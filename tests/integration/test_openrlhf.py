"""OpenRLHF's actor groups and vLLM engines, with the real openrlhf package, on a reservation.

The driver (``openrlhf_driver.py``) runs in a process of its own, as an OpenRLHF driver
does, with vLLM and flash_attn stood in for (``openrlhf_site``: CUDA-only, as OpenRLHF's
own tests stub them). This test process compares what every actor and engine worker
reports with Ray's group table and with the reservation, rank for rank. The cluster has
a head without GPUs and three nodes of 4 fake GPUs; the third is the spare a lost node's
slot moves to.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

if importlib.util.find_spec("openrlhf") is None:
    pytest.skip("openrlhf==0.11.2 is installed by scripts/test", allow_module_level=True)

import ray
from ray.util.placement_group import placement_group_table

import clients
from controller.state.scheduling import group_handle
from tests.integration.conftest import site_cluster

HERE = Path(__file__).parent
REPO = HERE.parent.parent
DRIVER = HERE / "openrlhf_driver.py"
BATCH = list(range(10))  # the driver's batch


@pytest.fixture(scope="module")
def orl_cluster():
    """A head without GPUs and three nodes of 4 fake GPUs; vLLM stood in for."""
    yield from site_cluster("openrlhf_site", {"num_cpus": 4, "num_gpus": 0}, 3)


def _driver(address: str, job: str, layout: str, out: Path, hold: bool = False):
    args = [sys.executable, str(DRIVER), job, layout, str(out)]
    if hold:
        args += ["--hold", "600"]
    return subprocess.Popen(
        args,
        env=dict(os.environ, RAY_ADDRESS=address),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _run(address: str, job: str, layout: str, out: Path) -> dict:
    p = _driver(address, job, layout, out)
    log, _ = p.communicate(timeout=400)
    assert p.returncode == 0, log[-4000:]
    return json.loads(out.read_text())


def _wait_for(out: Path, p: subprocess.Popen, timeout: float = 400) -> dict:
    deadline = time.monotonic() + timeout
    while not out.exists():
        if p.poll() is not None:
            raise AssertionError(p.stdout.read()[-4000:])
        assert time.monotonic() < deadline, "the driver wrote nothing"
        time.sleep(0.5)
    return json.loads(out.read_text())


def _bundle_nodes(pg_id: str) -> dict[int, str]:
    table = placement_group_table(group_handle(pg_id))
    assert table["state"] == "CREATED"
    return {int(i): n for i, n in table["bundles_to_node_id"].items()}


def _actor_state(actor_id: str) -> str:
    return (ray._private.state.state.actor_table(actor_id) or {}).get("State", "DEAD")


def _ip_of(node_id: str) -> str:
    return next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id)


def _check_actors(result: dict, res) -> dict[tuple[str, int], dict]:
    """Every OpenRLHF actor against Ray (the node of its bundle, the GPU and share Ray
    granted it) and against the reservation, rank for rank; the gloo group formed from
    OpenRLHF's environment alone."""
    seen = {}
    for component, facts in result["facts"].items():
        assignments = res.assignments(component)
        assert [f["rank"] for f in facts] == list(range(len(assignments)))
        rank0_ip = _ip_of(facts[0]["node_id"])
        for f, a in zip(facts, assignments, strict=True):
            where = f"{component}:{f['rank']}"
            assert f["placement_group_id"] == a.placement_group_id, where
            assert f["node_id"] == _bundle_nodes(a.placement_group_id)[a.bundle_index], where
            assert f["ray_gpu_ids"] == a.placement.cuda_visible_devices, where
            assert f["resources"].get("GPU") == pytest.approx(a.num_gpus), where
            # OpenRLHF's own environment: one visible GPU, the one Ray granted, LOCAL_RANK
            # 0 (Ray's NOSET switch off); the master is rank 0's node and placectl's port
            env = f["env"]
            assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, f["ray_gpu_ids"])), where
            assert env["LOCAL_RANK"] == "0", where
            assert env["RANK"] == str(f["rank"]), where
            assert env["WORLD_SIZE"] == str(len(assignments)), where
            assert env["MASTER_ADDR"] == rank0_ip, where
            assert env["MASTER_PORT"] == a.env["MASTER_PORT"], where
            assert f["master"] == [rank0_ip, int(a.env["MASTER_PORT"])], where
            assert env["PLACECTL_UID"] == res.uid, where
            seen[(component, f["rank"])] = f
        n = len(facts)
        assert result["gloo"][component] == [n * (n + 1) / 2] * n, component
    return seen


def _check_batch(result: dict, duplicate: int, world: int) -> None:
    """OpenRLHF's dispatch: chunk c of the batch to actors c*dup .. c*dup+dup-1."""
    chunks = world // duplicate
    size = -(-len(BATCH) // chunks)
    for rank, got in enumerate(result["batch"]):
        chunk = BATCH[(rank // duplicate) * size : (rank // duplicate + 1) * size]
        assert got == [[rank, v] for v in chunk], rank


def _check_engines(result: dict, res) -> None:
    """Each engine's workers on the GPUs of its bundles, by Ray's group table and by
    what Ray granted them, with placectl's share; OpenRLHF's kwargs passed through."""
    assignments = res.assignments("rollout")
    assert len(result["engines"]) == len(assignments)
    for i, (workers, a) in enumerate(zip(result["engines"], assignments, strict=True)):
        tp = len(a.placement.local_resource_ranks)
        assert len(workers) == tp
        nodes = _bundle_nodes(a.placement_group_id)
        for j, w in enumerate(workers):
            where = f"engine {i} worker {j}"
            assert w["engine_kwargs"]["seed"] == 7 + i, where  # OpenRLHF: seed + i
            assert w["engine_kwargs"]["tensor_parallel_size"] == tp, where
            assert w["args"][2] == 1 + i * tp, where  # OpenRLHF's rank offset
            assert w["engine"]["placement_group_id"] == a.placement_group_id, where
            assert w["engine"]["node_id"] == nodes[a.bundle_index], where
            assert w["placement_group_id"] == a.placement_group_id, where
            assert w["ray_gpu_ids"] == [a.placement.cuda_visible_devices[j]], where
            if tp > 1:
                bundle = a.bundle_indices[j]
                assert w["engine_env"]["VLLM_RAY_BUNDLE_INDICES"] == ",".join(
                    map(str, a.bundle_indices)
                ), where
                assert w["node_id"] == nodes[bundle], where
                assert w["resources"].get("GPU") == pytest.approx(a.child_share), where
                assert w["engine_kwargs"]["distributed_executor_backend"] == "ray", where
            else:
                assert w["engine_kwargs"]["distributed_executor_backend"] == "uni", where
                assert w["cuda_visible_devices"] == str(w["ray_gpu_ids"][0]), where


def test_colocated_actor_ref_and_tp2_engines_share_the_reserved_gpus(orl_cluster, tmp_path):
    c, _ = orl_cluster
    ctl = clients.connect()
    try:
        result = _run(c.address, "orl-colocated", "colocated", tmp_path / "out.json")
        res = ctl.reservation("orl-colocated")
        seen = _check_actors(result, res)
        _check_batch(result, duplicate=2, world=4)
        _check_engines(result, res)
        # actor and ref rank r on the same GPU of the same node, as --colocate_all wants
        for r in range(4):
            actor, ref = seen[("actor", r)], seen[("ref", r)]
            assert (actor["node_id"], actor["ray_gpu_ids"]) == (ref["node_id"], ref["ray_gpu_ids"])
        # engine i's workers on actor ranks 2i and 2i+1's GPUs
        for i, workers in enumerate(result["engines"]):
            assert [w["ray_gpu_ids"] for w in workers] == [
                seen[("actor", 2 * i + j)]["ray_gpu_ids"] for j in range(2)
            ]
    finally:
        ctl.release("orl-colocated")


def test_separate_layout_through_driver_kill_and_node_loss(orl_cluster, tmp_path):
    c, nodes = orl_cluster
    ctl = clients.connect()
    job = "orl-separate"
    try:
        # 1. a driver reserves and launches; it stays up holding its actors
        out1 = tmp_path / "first.json"
        p = _driver(c.address, job, "separate", out1, hold=True)
        first = _wait_for(out1, p)
        res = ctl.reservation(job)
        seen = _check_actors(first, res)
        _check_batch(first, duplicate=1, world=4)
        _check_engines(first, res)
        assert len({f["node_id"] for f in first["engines"][0]}) == 1
        train_node = seen[("actor", 0)]["node_id"]
        engine_node = first["engines"][0][0]["node_id"]
        assert train_node != engine_node

        # 2. the driver dies: its actors with it, the reservation stays
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        deadline = time.monotonic() + 120
        ids = [f["actor_id"] for f in first["facts"]["actor"]]
        while not all(_actor_state(i) == "DEAD" for i in ids):
            assert time.monotonic() < deadline, "the dead driver's actors are still alive"
            time.sleep(0.5)
        assert ctl.reservation(job).uid == first["uid"]

        # 3. the engines' node is lost; a driver started at once runs on the spare
        lost = next(n for n in nodes if n.node_id == engine_node)
        c.remove_node(lost, allow_graceful=False)  # every process killed, Ray not told
        second = _run(c.address, job, "separate", tmp_path / "second.json")
        res = ctl.reservation(job)
        assert second["uid"] == first["uid"] and second["epoch"] > first["epoch"]
        seen = _check_actors(second, res)
        _check_engines(second, res)
        assert seen[("actor", 0)]["node_id"] == train_node  # the kept slot did not move
        moved = {w["node_id"] for workers in second["engines"] for w in workers}
        assert engine_node not in moved and len(moved) == 1
    finally:
        ctl.release(job)
