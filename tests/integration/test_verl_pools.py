"""verl's pools as verl code uses them, against the real verl package: several worker
groups on one pool (two roles, a colocated class spawned, the fused class, a nested
worker found again detached), run once on verl's own ``RayResourcePool`` and once on a
placectl pool, with the same results. What each worker holds is Ray's word
(``get_assigned_resources``, ``get_accelerator_ids``), not placectl's."""

from __future__ import annotations

import time

import pytest
import ray

verl_base = pytest.importorskip("verl.single_controller.base")

from verl.single_controller.base.decorator import Dispatch, register  # noqa: E402
from verl.single_controller.ray.base import (  # noqa: E402
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
    create_colocated_worker_cls_fused,
)

import clients  # noqa: E402
from clients.integrations import verl as pverl  # noqa: E402
from controller import PlacementError  # noqa: E402
from tests.integration.conftest import testing_cluster as local_cluster  # noqa: E402

GROUPS = 5  # the groups each pool takes below: its max_colocate_count
# One process a group on each pool: a verl worker costs about 16 s of CPU to start here
# (torch and verl imported), and the two runs start 10 (with 2 ranks the test took 335 s).
# test_verl.py checks several ranks' order and devices.
RANKS = 1
# verl's own pool asks GROUPS CPUs a bundle; the reservation leaves the other node to it.
SPEC = {"num_nodes": 3, "component_placement": {"actor": f"0-{RANKS - 1}"}}


@pytest.fixture(scope="module")
def ctl():
    with local_cluster(2, gpus=RANKS, cpus=RANKS * GROUPS):
        controller = clients.connect()
        yield controller
        controller.release_all()


def held() -> dict:
    """What Ray granted this worker: its share of a GPU and which GPU."""
    ctx = ray.get_runtime_context()
    return {
        "gpu_share": round(ctx.get_assigned_resources().get("GPU", 0.0), 6),
        "gpus": [int(i) for i in ctx.get_accelerator_ids()["GPU"]],
        "node": ctx.get_node_id(),
    }


class Actor(verl_base.Worker):
    def __init__(self, x=0) -> None:
        super().__init__()
        self.x = x

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def get(self):
        return self.x + self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def where(self):
        return {"rank": self.rank, "world_size": self.world_size, **held()}


class Critic(verl_base.Worker):
    def __init__(self, val=10) -> None:
        super().__init__()
        self.val = val

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def sub(self, x):
        return x - self.val

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def where(self):
        return {"rank": self.rank, "world_size": self.world_size, **held()}


class Nested(verl_base.Worker):
    """A worker that builds another verl Worker inside itself."""

    def __init__(self, x=0) -> None:
        super().__init__()
        self.inner = Actor(x=x)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def get(self):
        return self.inner.get()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def where(self):
        return {"rank": self.rank, "world_size": self.world_size, **held()}


def cia(cls, **kwargs) -> RayClassWithInitArgs:
    return RayClassWithInitArgs(cls=ray.remote(cls), **kwargs)


def shape(reports: list[dict]) -> list[tuple]:
    """What two pools must agree on, rank by rank: rank, world size, the share of a GPU
    Ray granted and how many GPUs it shows (the GPUs themselves are each pool's own)."""
    return [(r["rank"], r["world_size"], r["gpu_share"], len(r["gpus"])) for r in reports]


def run_patterns(pool, group_cls, tag: str) -> dict:
    """verl's patterns on ``pool``, each a group of ``group_cls``; what they return."""
    out: dict = {}
    made: list = []

    def group(ray_cls_with_init, **kw):
        wg = group_cls(resource_pool=pool, ray_cls_with_init=ray_cls_with_init, **kw)
        made.append(wg)
        return wg

    try:
        actor = group(cia(Actor, x=2), name_prefix=f"{tag}actor_")
        critic = group(cia(Critic, val=10), name_prefix=f"{tag}critic_")
        out["actor"], out["critic"] = actor.get(), critic.sub([1])
        a, c = actor.where(), critic.where()
        out["shapes"] = [shape(a), shape(c)]
        # rank r of every group on a pool runs on rank r's GPU
        out["same_gpu"] = [
            (x["node"], x["gpus"]) == (y["node"], y["gpus"]) for x, y in zip(a, c, strict=True)
        ]

        both = {"actor": cia(Actor, x=5), "critic": cia(Critic, val=1)}
        colocated = group(create_colocated_worker_cls(both), name_prefix=f"{tag}colo_")
        spawned = colocated.spawn(prefix_set={"actor", "critic"})
        out["spawned"] = [spawned["actor"].get(), spawned["critic"].sub([7])]

        fused = group(create_colocated_worker_cls_fused(both), name_prefix=f"{tag}fused_")
        roles = fused.spawn(prefix_set={"actor", "critic"})
        out["fused"] = [roles["actor"].get(), roles["critic"].sub([3])]

        nested = group(cia(Nested, x=2), name_prefix=f"{tag}nested_", detached=True)
        found = group_cls.from_detached(
            name_prefix=nested.name_prefix,
            worker_names=nested.worker_names,
            ray_cls_with_init=cia(Nested, x=2),
        )
        out["nested"] = [nested.get(), found.get()]
        out["nested_shape"] = shape(found.where())
        return out
    finally:
        for wg in made:
            for w in wg.workers:
                ray.kill(w)


def test_several_groups_share_a_pool_as_on_verls_own(ctl):
    res = ctl.reserve("verl-pools", SPEC, timeout_s=120)
    ours = pverl.resource_pool(res, "actor", max_colocate_count=GROUPS)
    got = run_patterns(ours, pverl.PlacectlWorkerGroup, "p.")
    theirs = RayResourcePool([RANKS], use_gpu=True, max_colocate_count=GROUPS)
    want = run_patterns(theirs, RayWorkerGroup, "v.")
    assert got == want
    assert want["actor"] == [2] and want["nested"] == [[2]] * 2
    assert want["shapes"][0] == [(r, RANKS, round(1 / GROUPS, 6), 1) for r in range(RANKS)]
    assert got["same_gpu"] == [True] * RANKS
    # a placectl pool's workers run on the reservation's GPUs, in its ranks' order (a new
    # pool: each pool counts the groups made on it)
    where = [
        (a.placement.node_id, a.placement.cuda_visible_devices) for a in res.assignments("actor")
    ]
    again = pverl.resource_pool(res, "actor", max_colocate_count=GROUPS)
    actor = pverl.PlacectlWorkerGroup(resource_pool=again, ray_cls_with_init=cia(Actor))
    try:
        assert [(x["node"], x["gpus"]) for x in actor.where()] == where
    finally:
        for w in actor.workers:
            ray.kill(w)


def test_a_group_more_than_the_pool_holds_is_refused_before_anything_starts(ctl):
    res = ctl.reserve("verl-full", SPEC, timeout_s=120)
    pool = pverl.resource_pool(res, "actor", max_colocate_count=2)
    groups = [
        pverl.PlacectlWorkerGroup(
            resource_pool=pool, ray_cls_with_init=cia(Actor), name_prefix=f"full{i}_"
        )
        for i in range(2)
    ]
    started = time.monotonic()
    with pytest.raises(PlacementError, match=r"pool 'verl-full\.actor\.' .* is full: its 2 "):
        pverl.PlacectlWorkerGroup(
            resource_pool=pool, ray_cls_with_init=cia(Actor), name_prefix="full2_"
        )
    assert time.monotonic() - started < 1.0  # at once, not a wait
    alive = [a for a in ray.util.list_named_actors(all_namespaces=True) if "full2_" in str(a)]
    assert alive == []  # no worker of the refused group was started, or left pending
    assert [g.get() for g in groups] == [[0]] * 2  # the two that fit run
    with pytest.raises(PlacementError, match=r"max_colocate_count=0: .* 1 or more"):
        pverl.resource_pool(res, "actor", max_colocate_count=0)
    for g in groups:
        for w in g.workers:
            ray.kill(w)
