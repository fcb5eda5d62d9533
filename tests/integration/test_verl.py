"""verl on placectl, against the real verl package: its Worker, its dispatch modes, its
colocation, its detached workers. What each verl worker reports comes from verl's own
state and from Ray (the devices Ray granted, the node it runs on), and is compared with
the assignment placectl published for the same rank."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import ray

verl_base = pytest.importorskip("verl.single_controller.base")

from verl.single_controller.base.decorator import Dispatch, register  # noqa: E402
from verl.single_controller.ray.base import (  # noqa: E402
    RayClassWithInitArgs,
    RayWorkerGroup,
    create_colocated_worker_cls,
)

from clients.integrations import verl as pverl  # noqa: E402
from controller import PlacementError  # noqa: E402
from tests.integration.conftest import GPU_NODES, bundle_ids  # noqa: E402

DISAGGREGATED = {
    "num_nodes": 1 + GPU_NODES,
    "component_placement": {"actor": "0-3", "rollout": "4-7"},
}
# actor and ref share GPUs 0-3 rank by rank, as verl colocates them in one process.
COLOCATED = {
    "num_nodes": 1 + GPU_NODES,
    "component_placement": {"actor,ref": "0-3"},
}


class Reporter(verl_base.Worker):
    """A verl worker that says what verl and Ray made of it."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def report(self):
        ctx = ray.get_runtime_context()
        return {
            "verl_rank": self.rank,
            "verl_world_size": self.world_size,
            "RANK": os.environ["RANK"],
            "WORLD_SIZE": os.environ["WORLD_SIZE"],
            "LOCAL_RANK": os.environ.get("LOCAL_RANK"),
            "MASTER_ADDR": os.environ["MASTER_ADDR"],
            "MASTER_PORT": os.environ["MASTER_PORT"],
            "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "WG_PREFIX": os.environ.get("WG_PREFIX"),
            "ray_gpus": sorted(int(i) for i in ctx.get_accelerator_ids()["GPU"]),
            "node_id": ctx.get_node_id(),
            "group_id": ctx.get_placement_group_id(),
            "pid": os.getpid(),
        }

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def scaled(self, x):
        return x * 10 + self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce(self, value):
        import torch
        import torch.distributed as dist

        # verl's own trainers form their process group from the environment alone.
        if not dist.is_initialized():
            dist.init_process_group("gloo", init_method="env://")
        t = torch.tensor([float(value + self.rank)])
        dist.all_reduce(t)
        return t.item()


class Ref(Reporter):
    """A second role, colocated with ``Reporter`` in one verl process."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def role(self):
        return "ref"


def _cls(cls=Reporter) -> RayClassWithInitArgs:
    return RayClassWithInitArgs(cls=ray.remote(cls))


def ray_devices(assignments) -> list[list[int]]:
    """Per rank, the devices Ray holds in the rank's bundle, asked before workers fill it."""
    return [bundle_ids(a.placement_group_id, a.bundle_index) for a in assignments]


def _check_against_placectl(reports, assignments, devices, group_ids=False):
    assert len(reports) == len(assignments) == len(devices)
    for r, (got, a) in enumerate(zip(reports, assignments, strict=True)):
        p = a.placement
        assert (got["verl_rank"], got["RANK"]) == (r, str(r))
        assert (got["verl_world_size"], got["WORLD_SIZE"]) == (
            len(assignments),
            str(len(assignments)),
        )
        assert got["node_id"] == p.node_id, f"rank {r} runs on another node"
        # Ray granted this process the device of the bundle placectl assigned to the rank.
        assert got["ray_gpus"] == devices[r]
        assert got["ray_gpus"] == [int(d) for d in p.cuda_visible_devices]
        assert got["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, got["ray_gpus"]))
        assert got["LOCAL_RANK"] == "0"  # one visible device: torch's device 0 is its own
        assert (got["MASTER_ADDR"], got["MASTER_PORT"]) == (
            a.env["MASTER_ADDR"],
            a.env["MASTER_PORT"],
        )
        if group_ids:
            assert got["group_id"] == a.placement_group_id


def test_disaggregated_verl_ranks_run_where_placectl_placed_them(ctl):
    res = ctl.reserve("verl-dis", DISAGGREGATED, timeout_s=120)
    devices = {c: ray_devices(res.assignments(c)) for c in ("actor", "rollout")}
    # one through a resource pool, as trainers built on ResourcePoolManager do
    pool = pverl.resource_pool(res, "actor")
    actor = pverl.PlacectlWorkerGroup(resource_pool=pool, ray_cls_with_init=_cls())
    rollout = pverl.worker_group(res, "rollout", _cls())
    try:
        for wg, comp in ((actor, "actor"), (rollout, "rollout")):
            assert isinstance(wg, RayWorkerGroup) and wg.world_size == 4
            _check_against_placectl(
                wg.report(), res.assignments(comp), devices[comp], group_ids=True
            )
        # the two groups never share a device
        held = lambda wg: {(x["node_id"], g) for x in wg.report() for g in x["ray_gpus"]}  # noqa: E731
        assert not held(actor) & held(rollout)
        # verl's dispatch: DP_COMPUTE splits a list by rank and gathers it back in order
        assert actor.scaled([1, 2, 3, 4]) == [10, 21, 32, 43]
        # a gloo process group formed from the environment verl reads
        assert actor.all_reduce(1) == [4 + 0 + 1 + 2 + 3] * 4
        assert actor.execute_all_sync("report")[2]["verl_rank"] == 2
    finally:
        for wg in (actor, rollout):
            for w in wg.workers:
                ray.kill(w)


def test_colocated_roles_share_one_process_per_rank_with_placectls_shares(ctl):
    res = ctl.reserve("verl-col", COLOCATED, timeout_s=120)
    devices = ray_devices(res.assignments("actor"))
    wg = pverl.colocated_worker_group(res, {"actor": _cls(), "ref": _cls(Ref)})
    try:
        roles = wg.spawn(prefix_set={"actor", "ref"})
        actor, ref = roles["actor"], roles["ref"]
        a_reports, r_reports = actor.report(), ref.report()
        _check_against_placectl(a_reports, res.assignments("actor"), devices)
        assert [x["pid"] for x in a_reports] == [x["pid"] for x in r_reports]
        assert ref.role() == ["ref"] * 4
        # The process asks for both roles' shares of its GPU: what placectl accounted.
        shares = [res.assignments(c)[0].num_gpus for c in ("actor", "ref")]
        assert sum(shares) == pytest.approx(1.0)
        resources = ray.get([w.__ray_call__.remote(_granted) for w in wg.workers])
        assert [g["GPU"] for g in resources] == [pytest.approx(1.0)] * 4
        assert actor.all_reduce(0) == [6.0] * 4
    finally:
        for w in wg.workers:
            ray.kill(w)


def _granted(self):
    return ray.get_runtime_context().get_assigned_resources()


def test_a_trainers_pool_manager_runs_its_pools_on_the_reservation(ctl):
    """What verl's RayPPOTrainer.init_workers does with its manager, step by step."""
    conf = {
        "num_nodes": 1 + GPU_NODES,
        "component_placement": {"actor_rollout_ref": "0-3", "critic": "4-7"},
    }
    res = ctl.reserve("verl-trainer", conf, timeout_s=120)
    devices = {c: ray_devices(res.assignments(c)) for c in ("actor_rollout_ref", "critic")}
    pools = {"global_pool": "actor_rollout_ref", "critic_pool": "critic"}
    mapping = {"actor_rollout": "global_pool", "ref": "global_pool", "critic": "critic_pool"}
    manager = pverl.PlacectlResourcePoolManager(res, pools, mapping)
    manager.create_resource_pool()
    assert manager.get_n_gpus() == 8
    to_cls = {pool: {} for pool in manager.resource_pool_dict.values()}
    to_cls[manager.get_resource_pool("actor_rollout")].update(actor_rollout=_cls(), ref=_cls(Ref))
    to_cls[manager.get_resource_pool("critic")]["critic"] = _cls()
    every = {}
    groups = []
    try:
        for pool, class_dict in to_cls.items():
            wg = pverl.PlacectlWorkerGroup(
                resource_pool=pool,
                ray_cls_with_init=create_colocated_worker_cls(class_dict=class_dict),
                device_name="cuda",
            )
            groups.append(wg)
            every.update(wg.spawn(prefix_set=class_dict.keys()))
        for role, comp in (("actor_rollout", "actor_rollout_ref"), ("critic", "critic")):
            _check_against_placectl(every[role].report(), res.assignments(comp), devices[comp])
        assert every["ref"].role() == ["ref"] * 4
        # each worker asks what the workers of verl's own manager's pools ask of a GPU:
        # 1/max_colocate_count, its default 3 (one group here; up to three fit)
        granted = ray.get([w.__ray_call__.remote(_granted) for w in groups[0].workers])
        assert [g["GPU"] for g in granted] == [pytest.approx(1 / 3, abs=1e-4)] * 4  # Ray: 0.3333
    finally:
        for wg in groups:
            for w in wg.workers:
                ray.kill(w)
    with pytest.raises(PlacementError, match="no component 'reward'"):
        pverl.PlacectlResourcePoolManager(res, {"rm_pool": "reward"}, {})
    with pytest.raises(PlacementError, match="maps to pool 'nowhere'"):
        pverl.PlacectlResourcePoolManager(res, pools, {"critic": "nowhere"})


def test_roles_placed_differently_cannot_be_colocated(ctl):
    res = ctl.reserve("verl-dis2", DISAGGREGATED, timeout_s=120)
    with pytest.raises(PlacementError, match="not placed on the same devices"):
        pverl.colocated_worker_group(res, {"actor": _cls(), "rollout": _cls()})


def test_verls_own_worker_group_is_refused_a_placectl_pool(ctl):
    res = ctl.reserve("verl-pool", DISAGGREGATED, timeout_s=120)
    pool = pverl.resource_pool(res, "actor")
    assert (pool.world_size, pool.store) == (4, [4])
    with pytest.raises(PlacementError, match="PlacectlWorkerGroup"):
        RayWorkerGroup(resource_pool=pool, ray_cls_with_init=_cls())


def test_a_restarted_driver_reattaches_to_detached_verl_workers(cluster, ctl):
    res = ctl.reserve("verl-det", DISAGGREGATED, timeout_s=120)
    devices = ray_devices(res.assignments("actor"))
    wg = pverl.worker_group(res, "actor", _cls(), detached=True)
    before = wg.report()
    script = textwrap.dedent(
        f"""
        import json, ray, clients
        from clients.integrations import verl as pverl
        from verl.single_controller.ray.base import RayClassWithInitArgs
        from tests.integration.test_verl import Reporter
        ray.init(address={cluster.address!r}, logging_level="ERROR", log_to_driver=False)
        res = clients.connect().reservation("verl-det")
        wg = pverl.attach(res, "actor", RayClassWithInitArgs(cls=ray.remote(Reporter)))
        print(json.dumps({{"reports": wg.report(), "scaled": wg.scaled([1, 2, 3, 4])}}))
        """
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
            cwd=os.getcwd(),
        )
        got = json.loads(out.stdout.strip().splitlines()[-1])
        assert [x["pid"] for x in got["reports"]] == [x["pid"] for x in before]
        _check_against_placectl(got["reports"], res.assignments("actor"), devices)
        assert got["scaled"] == [10, 21, 32, 43]
    finally:
        for w in wg.workers:
            ray.kill(w)
    with pytest.raises(PlacementError, match="no running verl worker"):
        pverl.attach(res, "actor", _cls())


def test_the_guides_main_ppo_runner_hands_verl_the_reservations_pool(ctl):
    """The guide's placectl_main_ppo.py as written (its module body, not its hydra entry
    point): the runner's pool hook reserves and gives verl's trainer a pool manager over
    the reservation's GPUs."""
    import re
    import types

    from omegaconf import OmegaConf
    from verl.trainer.ppo.ray_trainer import Role

    page = (pathlib.Path(__file__).parents[2] / "docs" / "guides" / "verl.md").read_text()
    (block,) = re.findall(r"```python\n(# placectl_main_ppo\.py.*?)```", page, re.S)
    module = types.ModuleType("placectl_main_ppo")
    exec(compile(block, "placectl_main_ppo.py", "exec"), module.__dict__)
    runner = module.PlacectlTaskRunner()
    runner.mapping = {Role.ActorRollout: "global_pool"}
    config = OmegaConf.create({"trainer": {"experiment_name": "guide-ppo"}})
    try:
        manager = runner.init_resource_pool_mgr(config)
        manager.create_resource_pool()
        assert manager.get_n_gpus() == 8  # every GPU of the reservation, none of the head's
        res = ctl.reservation("guide-ppo")
        assert [a.placement.rank for a in res.assignments("actor_rollout_ref")] == list(range(8))
        assert issubclass(module.PlacectlTaskRunner, module.TaskRunner.__ray_actor_class__)
    finally:
        ctl.release("guide-ppo")
