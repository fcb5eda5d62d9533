"""RLinf's own workers, launched by RLinf's ``create_group().launch``, on a reservation.

The driver (``rlinf_driver.py``) runs in a process of its own, as an RLinf driver does;
this test process reads Ray's group table and placectl's reservation and compares them
with what every worker reports. The cluster's head has GPUs, as RLinf expects of the node
its driver runs on; a third node is the spare a lost node's slot moves to.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("rlinf.scheduler", reason="rlinf==0.3.0 is installed by scripts/test")

from ray.util.placement_group import placement_group_table

import clients
from controller.state.scheduling import group_handle
from tests.integration.conftest import site_cluster

HERE = Path(__file__).parent
REPO = HERE.parent.parent
DRIVER = HERE / "rlinf_driver.py"
CONFIG = HERE / "data" / "rlinf_libero_dagger.yaml"
JOB = "rlinf-dagger"


@pytest.fixture(scope="module")
def rl_cluster():
    """Head and two nodes, 4 fake GPUs each; RLinf's probe sees them (rlinf_site)."""
    yield from site_cluster(
        "rlinf_site", {"num_cpus": 8, "num_gpus": 4}, 2, {"PLACECTL_FAKE_NVML": "1"}
    )


def _driver(address: str, out: Path, hold: bool = False) -> subprocess.Popen:
    env = dict(os.environ, RAY_ADDRESS=address)
    args = [sys.executable, str(DRIVER), JOB, str(CONFIG), str(out)]
    if hold:
        args += ["--hold", "600"]
    return subprocess.Popen(
        args, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _run(address: str, out: Path) -> dict:
    p = _driver(address, out)
    log, _ = p.communicate(timeout=400)
    assert p.returncode == 0, log[-4000:]
    return json.loads(out.read_text())


def _bundle_nodes(pg_id: str) -> dict[int, str]:
    table = placement_group_table(group_handle(pg_id))
    assert table["state"] == "CREATED"
    return {int(i): n for i, n in table["bundles_to_node_id"].items()}


def _check_against_ray_and_placectl(result: dict, res) -> None:
    """Every worker against Ray (where its bundle is, what it was granted) and against
    the reservation (rank for rank); RLinf's collectives carried what was sent."""
    nodes = {}
    for component, facts in result["facts"].items():
        assignments = res.assignments(component)
        assert [f["rank"] for f in facts] == list(range(len(assignments)))
        for f, a in zip(facts, assignments, strict=True):
            where = f"{component}:{f['rank']}"
            assert f["world_size"] == len(assignments), where
            assert f["placement_group_id"] == a.placement_group_id, where
            assert f["node_id"] == _bundle_nodes(a.placement_group_id)[a.bundle_index], where
            assert f["node_id"] == a.placement.node_id, where
            # RLinf's node rank of the Ray node it runs on is placectl's
            assert f["cluster_node_rank"] == a.placement.node_rank, where
            assert f["env"]["CLUSTER_NODE_RANK"] == str(a.placement.node_rank), where
            # RLinf's CUDA_VISIBLE_DEVICES is the GPU Ray granted the bundle
            assert [int(g) for g in f["ray_gpu_ids"]] == a.placement.cuda_visible_devices, where
            assert f["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(f["ray_gpu_ids"]), where
            assert f["resources"].get("GPU") == pytest.approx(a.num_gpus), where
            assert f["env"]["LOCAL_RANK"] == "0", where  # RLinf's, for an isolated process
            assert f["env"]["PLACECTL_UID"] == res.uid, where
            assert f["env"]["PLACECTL_EPOCH"] == str(a.epoch), where
            nodes[(component, f["rank"])] = f["node_id"]
        n = len(facts)
        assert result["gloo"][component] == [n * (n + 1) / 2] * n, component
    sr = result["sendrecv"]
    assert sr["received"] == [7.0] * 4
    assert nodes[tuple(sr["from"])] != nodes[tuple(sr["to"])], "send/recv stayed on one node"


def test_rlinf_workers_in_the_reservation_through_driver_kill_and_node_loss(rl_cluster, tmp_path):
    c, nodes = rl_cluster
    ctl = clients.connect()
    try:
        # 1. A driver reserves (RLinf's example block), launches RLinf's own groups and
        #    stays up holding them.
        held = tmp_path / "first.json"
        p = _driver(c.address, held, hold=True)
        said = []
        for line in p.stdout:  # written when it says so, then it holds (pytest-timeout
            said.append(line)  # ends a driver that never does)
            if line.startswith("driver: written"):
                break
        else:
            raise AssertionError(f"the driver ended before writing: {''.join(said)[-4000:]}")
        first = json.loads(held.read_text())
        res = ctl.reservation(JOB)
        _check_against_ray_and_placectl(first, res)
        colocated = {f["node_id"] for k in ("env", "rollout") for f in first["facts"][k]}
        assert len(colocated) == 1 and first["facts"]["env"][0]["resources"]["GPU"] == 0.5
        uid, epoch = res.uid, res.epoch

        # 2. The driver is killed: its workers die with it, the reservation stays as it
        #    was. Then, before any driver is back, the node holding env and rollout is
        #    lost. The next driver starts at once: it waits for the repair and relaunches
        #    into the kept reservation (one driver run for both faults: each costs about
        #    45 s of CI's 2 cores).
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
        res.refresh()
        assert (res.uid, res.epoch) == (uid, epoch)
        lost = colocated.pop()
        node = next(n for n in nodes if n.node_id == lost)
        c.remove_node(node, allow_graceful=False)
        after = _run(c.address, tmp_path / "after.json")
        res.refresh()
        assert res.uid == uid and res.epoch > epoch
        _check_against_ray_and_placectl(after, res)
        # Where the node was not lost: the same bundles, new actors (the driver's died).
        kept = [k for k in after["facts"] if k not in ("env", "rollout")]
        assert kept, after["facts"].keys()
        for k in kept:
            for f, before in zip(after["facts"][k], first["facts"][k], strict=True):
                assert f["placement_group_id"] == before["placement_group_id"], k
                assert f["node_id"] == before["node_id"], k
                assert f["actor_id"] != before["actor_id"], k
        # Where it was: on the spare, with RLinf's node 1 there.
        moved = {f["node_id"] for k in ("env", "rollout") for f in after["facts"][k]}
        assert moved.isdisjoint({lost}) and len(moved) == 1
        assert {f["cluster_node_rank"] for f in after["facts"]["rollout"]} == {1}
    finally:
        ctl.release_all()
