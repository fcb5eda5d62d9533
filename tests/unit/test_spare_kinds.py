"""Spares of more than one kind, on the in-memory fake cluster: with trainers and rollout
on nodes of their own and both keeping standbys, two held spares copy a trainer node and
a rollout node; each runs its kind's standbys, a lost node takes the spare of its kind
(rollout that runs short included: its replacement is loaded there), and the node that
joins next is held as the kind missing."""

from __future__ import annotations

import pytest

from clients.render import render_reservation
from tests.unit.fakes import assignments, cluster, controller, info, run, stored, until
from tests.unit.test_held_spares import held

KINDS = {
    "num_nodes": 3,  # head + the trainers' node + the rollout's node (+ two held spares)
    "spares": 2,
    "component_placement": {
        "actor": {"placement": "0-3", "standby": True},
        "rollout": {"placement": "4-7", "on_loss": "continue", "standby": True},
    },
}
# As the GRPO job's --degraded: a rollout node without a spare of its kind takes another.
TAKING = {
    **KINDS,
    "component_placement": {
        **KINDS["component_placement"],
        "rollout": {**KINDS["component_placement"]["rollout"], "take_spares": True},
    },
}


async def kinds_job(spec: dict = KINDS):
    """``spec`` reserved on a head and four GPU nodes of 4, once it holds both spares: the
    fake cluster, the controller, the record, and its spares by the node rank copied."""
    fake = cluster(gpu_nodes=4)
    ctl = await controller(fake)
    await ctl.reserve("j", spec, 5)
    rec = await held(fake, "j", 2)
    return fake, ctl, rec, {s.copies: s for s in rec.spares}


def test_two_spares_copy_a_trainer_node_and_a_rollout_node_and_run_their_standbys():
    async def go():
        _, ctl, _, by_rank = await kinds_job()
        # node rank 1 holds the trainers (GPUs 0-3), node rank 2 rollout (GPUs 4-7)
        assert sorted(by_rank) == [1, 2]
        actor = assignments(await ctl.standbys("j", "actor"))
        rollout = assignments(await ctl.standbys("j", "rollout"))
        assert {a.placement_group_id for a in actor} == {by_rank[1].group_id}
        assert {a.placement_group_id for a in rollout} == {by_rank[2].group_id}
        assert len(actor) == len(rollout) == 4
        shown = render_reservation(info(await ctl.status("j")), {})
        for s in by_rank.values():  # status names the node each spare copies
            assert f"group {s.group_id}, a copy of node {s.copies}" in shown
        await ctl.stop()

    run(go())


@pytest.mark.parametrize("spec", [KINDS, TAKING], ids=["own-spare", "take-spares"])
@pytest.mark.parametrize("free", [True, False], ids=["a-node-free", "none-free"])
def test_a_lost_rollout_node_takes_the_rollout_spare_whose_standbys_stand_in_for_it(spec, free):
    """Rollout runs short (``on_loss: continue``) with standbys: its lost node takes the
    spare of its kind at once, whether a free node would do or not, and whether it may
    take another kind's spare or not (its replacements are loaded there); every lost
    rank's new bundle is one a rollout standby runs in; the trainers' spare stays held.
    The node that joins next is held as the rollout spare again."""

    async def go():
        fake, ctl, rec, by_rank = await kinds_job(spec)
        if free:  # a repair could place the slot there
            fake.add_node(num_gpus=4, num_cpus=4)
        standing = {
            (a.placement_group_id, a.bundle_index)
            for a in assignments(await ctl.standbys("j", "rollout"))
        }
        fake.kill_node(next(s.node_id for s in rec.slots if s.node_rank == 2))
        rec = await until(lambda: (r := stored(fake, "j")).epoch == 2 and r)
        assert rec.state == "ready", rec.reason
        (slot,) = [s for s in rec.slots if s.node_rank == 2]
        assert (slot.group_id, slot.node_id) == (by_rank[2].group_id, by_rank[2].node_id)
        moved = assignments(await ctl.assignments("j", "rollout"))
        assert {(a.placement_group_id, a.bundle_index) for a in moved} == standing
        if not free:  # the operator's node joins
            fake.add_node(num_gpus=4, num_cpus=4)
        rec = await until(lambda: (r := stored(fake, "j")) and len(r.spares) == 2 and r)
        kept = {s.copies: s for s in rec.spares}
        assert kept[1].group_id == by_rank[1].group_id  # the trainers' spare untouched
        assert kept[2].group_id != by_rank[2].group_id  # a new rollout spare
        await ctl.stop()

    run(go())


def test_a_lost_trainer_node_takes_the_trainer_spare_not_the_rollout_one():
    """Twice: the second time the trainer spare (held anew on the node that joined) comes
    after the rollout spare in the record, where a repair blind to kinds takes the first
    spare that fits."""

    async def go():
        fake, ctl, rec, by_rank = await kinds_job()
        for epoch in (2, 3):
            fake.kill_node(next(s.node_id for s in rec.slots if s.node_rank == 1))
            rec = await until(lambda e=epoch: (r := stored(fake, "j")).epoch == e and r)
            assert rec.state == "ready", rec.reason
            (slot,) = [s for s in rec.slots if s.node_rank == 1]
            assert slot.group_id == by_rank[1].group_id
            assert [s.group_id for s in rec.spares] == [by_rank[2].group_id]
            fake.add_node(num_gpus=4, num_cpus=4)  # the operator's node: the next spare
            rec = await until(lambda: (r := stored(fake, "j")) and len(r.spares) == 2 and r)
            by_rank = {s.copies: s for s in rec.spares}
            assert [s.copies for s in rec.spares] == [2, 1]  # the rollout spare first
        await ctl.stop()

    run(go())


def test_without_a_spare_of_its_kind_rollout_leaves_the_trainers_spare_to_them():
    """The rollout spare is not held (no node free for it): a lost rollout node waits
    for a node, as rollout without standbys does, and the trainers keep theirs."""

    async def go():
        fake = cluster(gpu_nodes=3)  # one spare's worth of free nodes: the trainers'
        ctl = await controller(fake)
        await ctl.reserve("j", KINDS, 5)
        rec = await held(fake, "j", 1)
        (spare,) = rec.spares
        assert spare.copies == 1  # the fullest kind first
        fake.kill_node(next(s.node_id for s in rec.slots if s.node_rank == 2))
        rec = await until(lambda: (r := stored(fake, "j")).state == "degraded" and r)
        assert "waiting for one to join" in rec.reason
        assert [s.group_id for s in rec.spares] == [spare.group_id]
        await ctl.stop()

    run(go())
