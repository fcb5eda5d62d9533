"""Which lost node a held spare stands in for, on the in-memory fake cluster: any whose
bundles it can hold (by resources, not by which node it copied); not a node whose ranks
all run short, which waits for a free node and leaves the spare to the standbys, unless
they say ``take_spares`` (then a free node first, else the spare); and a repair with too
few spares takes those there are and stays degraded for the rest."""

from __future__ import annotations

from controller.state.records import BundleRecord
from controller.state.spares import holds
from tests.unit.fakes import assignments, cluster, controller, run, stored, until
from tests.unit.test_held_spares import held, with_spares


def test_a_lost_node_of_fewer_bundles_takes_the_held_spare_that_can_hold_them():
    """GPUs 0-5 on nodes of 4: node rank 1 holds four bundles, node rank 2 two; the held
    spare copies the fuller node. Node rank 2 lost with no free node left: its two ranks
    go to the spare's bundles of their local indices, on the spare's devices, and the
    job is ready, not waiting for a node to join (#59 item 5)."""

    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake)
        await ctl.reserve("j", with_spares(1, "0-5"), 5)
        rec = await held(fake, "j")
        (spare,) = rec.spares
        assert len(spare.bundles) == 4
        small = next(s for s in rec.slots if s.node_rank == 2)
        assert len(small.bundles) == 2
        fake.kill_node(small.node_id)
        rec = await until(lambda: (r := stored(fake, "j")).epoch == 2 and r)
        assert rec.state == "ready", rec.reason
        (slot,) = [s for s in rec.slots if s.node_rank == 2]
        assert (slot.group_id, slot.node_id) == (spare.group_id, spare.node_id)
        devices = {i: b.physical_id for i, b in enumerate(spare.bundles)}
        moved = [
            a for a in assignments(await ctl.assignments("j", "actor")) if a.placement.rank >= 4
        ]
        assert [(a.placement.rank, a.placement_group_id, a.bundle_index) for a in moved] == [
            (4, spare.group_id, 0),
            (5, spare.group_id, 1),
        ]
        assert [a.env["CUDA_VISIBLE_DEVICES"] for a in moved] == [
            str(devices[0]),
            str(devices[1]),
        ]
        await ctl.stop()

    run(go())


def test_a_spare_holds_only_bundles_it_has_room_for():
    """The rule: each lost bundle needs one of its kind and local index in the spare,
    with at least its resources; more bundles than it has, another kind or a bigger
    bundle never fit."""
    four = [BundleRecord("accelerator", i, {"GPU": 1.0, "CPU": 1.0}) for i in range(4)]
    assert holds(four, four[2:]) and holds(four, four)
    assert not holds(four[:2], four)
    assert not holds(four, [BundleRecord("accelerator", 1, {"GPU": 2.0})])
    assert not holds(four, [BundleRecord("node", -1, {"CPU": 1.0})])


SPLIT = {
    "num_nodes": 4,  # head + the trainers' node + the rollout's node (+ a held spare)
    "spares": 1,
    "component_placement": {
        "actor": {"placement": "0-3", "standby": True},
        "rollout": {"placement": "4-7", "on_loss": "continue"},
    },
}


async def split_job(spec: dict = SPLIT):
    """``spec`` (SPLIT) reserved on a head and three GPU nodes, once it holds its spare:
    the fake cluster, the controller, the record and the spare."""
    fake = cluster(gpu_nodes=3)
    ctl = await controller(fake)
    await ctl.reserve("j", spec, 5)
    rec = await held(fake, "j")
    return fake, ctl, rec, rec.spares[0]


def test_a_lost_node_of_ranks_that_run_short_leaves_the_spare_to_the_standbys():
    """Rollout that runs short loses nothing by waiting for a free node; the trainers'
    standbys on the held spare would be lost with it. A trainer's node still takes the
    spare at once."""

    async def go():
        fake, ctl, rec, spare = await split_job()
        # node rank 1 holds the trainers (GPUs 0-3), node rank 2 rollout (GPUs 4-7)
        rollout_node = next(s.node_id for s in rec.slots if s.node_rank == 2)
        fake.kill_node(rollout_node)
        rec = await until(lambda: (r := stored(fake, "j")).state == "degraded" and r)
        assert "waiting for one to join" in rec.reason
        assert "the held spares are left to the standbys: take_spares: true" in rec.reason
        assert [s.group_id for s in rec.spares] == [spare.group_id]  # still held
        fake.add_node(num_gpus=4, num_cpus=4)  # a free node joins: the slot goes there
        rec = await until(lambda: (r := stored(fake, "j")).state == "ready" and r)
        placed = {s.node_id for s in rec.slots}
        assert spare.node_id not in placed and rollout_node not in placed
        assert [s.group_id for s in rec.spares] == [spare.group_id]
        # A trainer's node still takes the spare at once.
        actor_node = next(s.node_id for s in rec.slots if s.node_rank == 1)
        fake.kill_node(actor_node)
        rec = await until(
            lambda: (r := stored(fake, "j")).state == "ready" and r.epoch > rec.epoch and r
        )
        assert spare.group_id in {s.group_id for s in rec.slots}
        await ctl.stop()

    run(go())


TAKING = {
    **SPLIT,
    "component_placement": {
        **SPLIT["component_placement"],
        "rollout": {"placement": "4-7", "on_loss": "continue", "take_spares": True},
    },
}


def test_ranks_that_run_short_and_take_spares_take_the_held_spare_when_no_node_is_free():
    """``take_spares``: the rollout node's slot is placed on the spare at once rather
    than waiting for a node to join (the trainers' standbys there end); the node that
    joins is held as the new spare."""

    async def go():
        fake, ctl, rec, spare = await split_job(TAKING)
        rollout_node = next(s.node_id for s in rec.slots if s.node_rank == 2)
        fake.kill_node(rollout_node)
        rec = await until(lambda: (r := stored(fake, "j")).epoch == 2 and r)
        assert rec.state == "ready", rec.reason
        (slot,) = [s for s in rec.slots if s.node_rank == 2]
        assert (slot.group_id, slot.node_id) == (spare.group_id, spare.node_id)
        rollout = assignments(await ctl.assignments("j", "rollout"))
        assert {(a.placement_group_id, a.placement.node_id) for a in rollout} == {
            (spare.group_id, spare.node_id)
        }
        joined = fake.add_node(num_gpus=4, num_cpus=4)
        rec = await until(lambda: (r := stored(fake, "j")).spares and r)
        assert [s.node_id for s in rec.spares] == [joined]
        await ctl.stop()

    run(go())


def test_ranks_that_take_spares_go_to_a_free_node_first():
    """A free node that fits is taken before the spare: the standbys stay warm."""

    async def go():
        fake, ctl, rec, spare = await split_job(TAKING)
        free = fake.add_node(num_gpus=4, num_cpus=4)
        rollout_node = next(s.node_id for s in rec.slots if s.node_rank == 2)
        fake.kill_node(rollout_node)
        rec = await until(lambda: (r := stored(fake, "j")).epoch == 2 and r)
        assert rec.state == "ready", rec.reason
        (slot,) = [s for s in rec.slots if s.node_rank == 2]
        assert slot.node_id == free
        assert [s.group_id for s in rec.spares] == [spare.group_id]
        await ctl.stop()

    run(go())


def test_a_repair_places_what_it_can_and_stays_degraded_for_the_rest():
    """Two nodes lost at once, a spare for one: the trainers' node goes to the spare now
    (a new epoch), and the rollout's waits for a node, the record degraded and saying
    why: never all or nothing."""

    async def go():
        fake, ctl, rec, spare = await split_job()
        by_rank = {s.node_rank: s.node_id for s in rec.slots}
        fake.kill_node(by_rank[1])  # the trainers'
        fake.kill_node(by_rank[2])  # the rollout's
        rec = await until(lambda: (r := stored(fake, "j")).epoch == rec.epoch + 1 and r)
        assert rec.state == "degraded" and "waiting for one to join" in rec.reason
        now = {s.node_rank: s for s in rec.slots}
        assert now[1].group_id == spare.group_id  # the trainers' slot is the held spare
        assert now[2].node_id == by_rank[2]  # the rollout's still names its lost node
        fake.add_node(num_gpus=4, num_cpus=4)
        rec = await until(lambda: (r := stored(fake, "j")).state == "ready" and r)
        assert {s.node_id for s in rec.slots}.isdisjoint({by_rank[1], by_rank[2]})
        await ctl.stop()

    run(go())
