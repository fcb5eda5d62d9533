"""Faults in combination on the fake cluster: each fault shape under each kind of job,
at a moment that matters (nothing else, the controller restarted while the fault is on,
a driver polling for verdicts all along), against the invariants every combination
keeps once the fault is over and the controller has settled:

* the job is ready, every slot and held spare on a live node that is healthy and not
  held down;
* no node is lost to a blip shorter than the grace (nothing fenced), and a dead one is
  fenced only on proof;
* a node is suspected at most once per time it went silent, and never adopted as a
  spare while silent;
* nothing is left behind: the groups alive are the ones the records name, and no group
  is kept for a node that is back.

Ray never gives up on a node here (the fake's nodes die only when killed or fenced), so
every verdict is placectl's; the clock is virtual."""

from __future__ import annotations

import asyncio
import itertools

import msgspec
import pytest

from controller.runtime.core import doubts
from controller.runtime.core.settings import FAST
from tests.unit.fakes import cluster, controller, live_groups, run, stored, table_groups, until

RULE = msgspec.structs.replace(
    FAST, suspect_after=0.3, fence_grace=60.0, liveness_period=0.05, reconcile_period=0.05
)

JOBS = {
    "plain": ({"num_nodes": 3, "component_placement": {"actor": "0-7"}}, 4),
    "a held spare": ({"num_nodes": 3, "spares": 1, "component_placement": {"actor": "0-7"}}, 4),
    "two kinds of spare": (
        {
            "num_nodes": 3,
            "spares": 2,
            "component_placement": {
                "actor": {"placement": "0-3", "standby": True},
                "rollout": {"placement": "4-7", "on_loss": "continue", "standby": True},
            },
        },
        5,
    ),
}


async def _killed(fake, nodes):
    fake.kill_node(nodes[0])


async def _crashed(fake, nodes):
    fake.crash_node(nodes[0])  # its port refused: proof


async def _cut(fake, nodes):
    fake.cut.add(nodes[0])
    await asyncio.sleep(5.0)
    fake.cut.discard(nodes[0])


async def _hung(fake, nodes):
    fake.crash_node(nodes[0], "silent")  # every process stopped, then resumed
    await asyncio.sleep(5.0)
    fake.crash_node(nodes[0], "ok")


async def _split(fake, nodes):
    fake.split(set(nodes))  # the job's hosts reach each other, not the head's side
    await asyncio.sleep(5.0)
    fake.split()


async def _flapping(fake, nodes):
    for _ in range(3):
        fake.cut.add(nodes[0])
        await asyncio.sleep(1.0)
        fake.cut.discard(nodes[0])
        await asyncio.sleep(2.0)


# shape -> (the fault, how often each job node may be suspected, fenced nodes allowed)
SHAPES = {
    "killed": (_killed, 0, "none"),
    "crashed": (_crashed, 1, "the first"),
    "cut 5 s": (_cut, 1, "none"),
    "hung 5 s": (_hung, 1, "none"),
    "split from the head": (_split, 1, "none"),
    "flapping": (_flapping, 3, "none"),
}
MOMENTS = ("alone", "a controller restart", "a driver polling")
# Every shape under every kind of job; the moments in turn, so each meets every shape.
CASES = [
    (shape, job, MOMENTS[i % len(MOMENTS)])
    for i, (shape, job) in enumerate(itertools.product(SHAPES, JOBS))
]


@pytest.mark.parametrize(("shape", "job", "moment"), CASES, ids=[" / ".join(c) for c in CASES])
def test_a_fault_at_a_moment_keeps_every_invariant(shape, job, moment):
    async def go():
        spec, gpu_nodes = JOBS[job]
        fake = cluster(gpu_nodes=gpu_nodes)
        ctl = await controller(fake, RULE)
        await ctl.reserve("j", spec)
        if spec.get("spares"):
            await until(lambda: len(stored(fake, "j").spares) == spec["spares"], timeout=10)
        nodes = sorted(stored(fake, "j").node_ids())
        fault, most, fenced = SHAPES[shape]
        polls = [0]

        async def poll():
            while True:
                await ctl.verdicts("j")
                polls[0] += 1
                await asyncio.sleep(0.1)

        poller = asyncio.ensure_future(poll()) if moment == "a driver polling" else None
        faulting = asyncio.ensure_future(fault(fake, nodes))
        if moment == "a controller restart":
            await until(lambda: stored(fake, "j").epoch >= 2, timeout=10)  # mid-fault
            await ctl.stop()
            ctl = await controller(fake, RULE)
        await faulting
        if fenced == "the first":  # proven dead: fenced, then its slot moves
            await until(lambda: nodes[0] in fake.fenced, timeout=10)

        def settled():
            r = stored(fake, "j")
            view = ctl.ops.ctx.nodes
            held = view.flaps.held(asyncio.get_running_loop().time())
            places = r.node_ids() | {s.node_id for s in r.spares}
            return (
                r.state == "ready"
                and not r.leaving
                and all(fake.nodes_by_id[n].info.alive for n in places)
                and all(view.phase(n) == doubts.HEALTHY and n not in held for n in places)
                and r
            )

        record = await until(settled, timeout=120)
        if poller is not None:
            poller.cancel()
            assert polls[0] > 0
        told = [e for e in fake.metrics.events if e.kind == "suspected"]
        for n in nodes:
            ip = fake.nodes_by_id[n].info.ip
            assert sum(f"node {ip} " in e.message for e in told) <= most, (n, told)
        assert set(fake.fenced) == ({nodes[0]} if fenced == "the first" else set())
        # A group being made (a spare the Holder takes) is named once its step commits:
        # none may stay unnamed.
        await until(lambda: not live_groups(fake) - table_groups(fake) - _demand(fake), 10)
        assert record.group_ids() <= live_groups(fake)
        await ctl.stop()

    run(go())


def _demand(fake) -> set[str]:
    """The groups that only show the autoscaler a demand (no node ever comes here)."""
    return {g.gid for g in fake.groups_by_id.values() if "demand" in g.name}
