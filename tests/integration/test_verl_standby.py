"""verl's worker group on placectl, repaired by promoting standbys, against the real verl
package: the standbys are verl ``Worker``s on the held spare, a node lost abruptly is
repaired by :meth:`PlacectlWorkerGroup.repair`, and what verl's own fields, the
processes' ids and a gloo group formed from the environment alone say afterwards is
read from the workers, through verl's dispatch."""

from __future__ import annotations

import datetime
import os

import pytest
import ray

verl_base = pytest.importorskip("verl.single_controller.base")

from verl.single_controller.base.decorator import Dispatch, register  # noqa: E402
from verl.single_controller.ray.base import RayClassWithInitArgs  # noqa: E402

import clients  # noqa: E402
from clients.integrations import verl as pverl  # noqa: E402
from tests.integration.conftest import held_spare, local_cluster, remove, wait_for  # noqa: E402

JOB = "verl-standby"
CONF = {
    "num_nodes": 2,  # head + one node of 4 GPUs
    "spares": 1,
    "component_placement": {"actor": {"placement": "0-3", "standby": True}},
}


@pytest.fixture(scope="module")
def cluster():
    """Head + the job's node + the held spare (4 fake GPUs each)."""
    yield from local_cluster(gpu_nodes=2)


class Trainer(verl_base.Worker):
    """A verl worker that says what verl and the process are."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def report(self):
        return {
            "verl_rank": self.rank,
            "verl_world_size": self.world_size,
            "verl_master": list(self.get_master_addr_port()),
            "RANK": os.environ.get("RANK"),
            "STANDBY": os.environ.get("PLACECTL_STANDBY"),
            "node": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
        }

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce(self, value):
        import torch
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        timeout = datetime.timedelta(seconds=30)
        dist.init_process_group("gloo", init_method="env://", timeout=timeout)
        t = torch.tensor([float(value + self.rank)])
        dist.all_reduce(t)
        return t.item()


def test_a_verl_group_is_repaired_by_promoting_its_standbys(cluster):
    ctl = clients.connect()
    res = ctl.reserve(JOB, CONF, timeout_s=60)
    try:
        job_node, spare = res.refresh().slots[0].node_id, held_spare(res)
        cls = RayClassWithInitArgs(cls=ray.remote(Trainer))
        wg = pverl.worker_group(res, "actor", cls, detached=True)

        def standing():
            wg.refill_standbys()
            seen = ray.get([s.report.remote() for s in wg.standbys], timeout=60)
            return len(seen) == 4 and all(s["node"] == spare for s in seen) and seen

        waiting = wait_for(standing, timeout=90)
        for s in waiting:  # verl's constructor ran; no rank to join a collective as
            assert s["verl_rank"] == -1 and s["RANK"] == "-1" and s["STANDBY"] == "1"
        assert wg.all_reduce(1) == [10.0] * 4  # 4 x 1 + (0 + 1 + 2 + 3)

        remove(cluster, job_node)
        assert wg.repair(timeout=120) == [0, 1, 2, 3]
        reports = wg.report()  # verl's dispatch, to the group's workers now
        assert sorted(r["pid"] for r in reports) == sorted(s["pid"] for s in waiting)
        fresh = res.assignments("actor")
        for r, got in enumerate(reports):
            assert (got["verl_rank"], got["RANK"], got["verl_world_size"]) == (r, str(r), 4)
            assert got["STANDBY"] is None and got["node"] == spare
            want = [fresh[r].env["MASTER_ADDR"], fresh[r].env["MASTER_PORT"]]
            assert got["verl_master"] == want
        # The environment alone forms the group again, on the promoted processes.
        assert wg.all_reduce(2) == [14.0] * 4

        # A new driver's verl group finds the promoted workers by name.
        again = pverl.attach(res, "actor", cls)
        assert [r["pid"] for r in again.report()] == [r["pid"] for r in reports]
        for w in wg.workers:
            ray.kill(w, no_restart=True)
        for s in wg.standbys:
            ray.kill(s, no_restart=True)
    finally:
        ctl.release(JOB)
