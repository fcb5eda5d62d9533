"""The verl node-loss recipe (docs/guides/verl.md), run as written: a driver process of its
own, restarted whenever it exits with an error, as a job's supervisor would; the node
holding every rank dies abruptly mid-run. The oracle is the job: every step's all-reduced
result equals the fault-free run's, each step is recorded once, and the ranks that
finish run where Ray's tables put the repaired reservation's bundles."""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest
import ray

verl_base = pytest.importorskip("verl.single_controller.base")

from verl.single_controller.base.decorator import Dispatch, register  # noqa: E402

import clients  # noqa: E402
from tests.integration.conftest import bundle_ids, local_cluster  # noqa: E402

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "guides" / "verl.md"
JOB = "verl-grpo"
CONF = {"num_nodes": 2, "component_placement": {"actor": "0-3"}}  # head + one node
STEPS = 8
WORLD = 4


def recipe() -> str:
    found = re.search(r"```python\n# recipe: verl-node-loss\n(.*?)```", PAGE.read_text(), re.S)
    assert found, "docs/guides/verl.md lost its node-loss recipe"
    return found.group(1)


@pytest.fixture(scope="module")
def cluster():
    """Head (no GPUs) + two nodes of 4 fake GPUs: one for the job, one spare."""
    yield from local_cluster(gpu_nodes=2)


class Trainer(verl_base.Worker):
    """A verl worker whose step is a collective, as a training step's gradients are."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def train_step(self, step: int) -> dict:
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            timeout = datetime.timedelta(seconds=20)
            dist.init_process_group("gloo", init_method="env://", timeout=timeout)
        time.sleep(1.0)  # a step takes a while: the node can die in the middle of one
        t = torch.tensor([float((step + 1) * (self.rank + 1))])
        dist.all_reduce(t)
        ctx = ray.get_runtime_context()
        return {"loss": t.item(), "node": ctx.get_node_id(), "gpus": ctx.get_accelerator_ids()}


class Checkpoints:
    """What the job keeps on shared storage: the steps done and each step's result."""

    def __init__(self, path: str) -> None:
        self.path = pathlib.Path(path)

    def _read(self) -> dict:
        return json.loads(self.path.read_text()) if self.path.exists() else {"steps": []}

    def latest(self) -> int:
        return len(self._read()["steps"])

    def save(self, step: int, losses: list[dict]) -> None:
        kept = self._read()
        assert len(kept["steps"]) == step - 1, "a step recorded twice or skipped"
        kept["steps"].append(losses)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(kept))
        tmp.replace(self.path)  # atomic, as a checkpoint must be


def _driver(address: str, checkpoint: pathlib.Path) -> subprocess.Popen:
    head = (
        "import ray\n"
        "from verl.single_controller.ray.base import RayClassWithInitArgs\n"
        "from tests.integration.test_node_loss import Checkpoints, Trainer\n"
        f"ray.init(address={address!r}, logging_level='ERROR', log_to_driver=False)\n"
        f"job, conf, total_steps = {JOB!r}, {CONF!r}, {STEPS}\n"
        f"checkpoints = Checkpoints({str(checkpoint)!r})\n"
        "actor_cls = RayClassWithInitArgs(cls=ray.remote(Trainer))\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", head + recipe()],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=os.getcwd(),
    )


def test_a_verl_job_restarted_by_its_supervisor_finishes_after_an_abrupt_node_loss(
    cluster, tmp_path
):
    checkpoint = tmp_path / "checkpoint.json"
    kept = Checkpoints(str(checkpoint))
    ctl = clients.connect()
    runs, killed, lost = [], False, None
    try:
        while len(runs) < 3:
            p = _driver(cluster.address, checkpoint)
            deadline = time.monotonic() + 400
            while p.poll() is None:
                assert time.monotonic() < deadline, "the driver hangs"
                if not killed and kept.latest() >= 2:  # mid-run: the job's node dies
                    lost = ctl.status(JOB).slots[0].node_id
                    node = next(n for n in cluster.list_all_nodes() if n.node_id == lost)
                    cluster.remove_node(node, allow_graceful=False)
                    killed = True
                time.sleep(0.2)
            runs.append((p.returncode, p.stdout.read()))
            if p.returncode == 0:
                break
        assert killed and [code for code, _ in runs][-1] == 0, runs[-1][1][-3000:]
        assert len(runs) == 2, [out[-2000:] for _, out in runs]  # one failure, one restart

        steps = json.loads(checkpoint.read_text())["steps"]
        fault_free = [float((s + 1) * sum(range(1, WORLD + 1))) for s in range(STEPS)]
        assert [[r["loss"] for r in losses] for losses in steps] == [
            [x] * WORLD for x in fault_free
        ]
        res = ctl.reservation(JOB)
        assert res.state == "ready" and res.epoch > 1
        last = steps[-1]
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        assignments = res.assignments("actor")
        for r, (got, a) in enumerate(zip(last, assignments, strict=True)):
            assert got["node"] == a.placement.node_id != lost and got["node"] in alive, r
            assert sorted(int(g) for g in got["gpus"]["GPU"]) == bundle_ids(
                a.placement_group_id, a.bundle_index
            ), r
    finally:
        ctl.release_all(force=True)
