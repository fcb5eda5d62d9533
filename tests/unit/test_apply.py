"""apply, resize and move on the fake cluster: what stays, what comes, what goes, and
that a failure or a crash at any step leaves the old reservation or the new one."""

from __future__ import annotations

import msgspec
import pytest

from controller.errors import (
    PlacementError,
    ReservationError,
    ReservationInfeasible,
    ReservationTimeout,
)
from controller.runtime.controller import SimulatedCrash
from controller.state.change import ApplySummary
from tests.unit.fakes import (
    cluster,
    controller,
    live_groups,
    published,
    run,
    stored,
    table,
    table_groups,
    until,
)

NODES = 3  # the head and two GPU nodes: node ranks 1 and 2 hold GPUs


def conf(**components) -> dict:
    return {"num_nodes": NODES, "component_placement": components}


def summary(data: bytes) -> ApplySummary:
    return msgspec.msgpack.decode(data, type=ApplySummary)


def groups_by_rank(fake, job: str) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for s in stored(fake, job).slots:
        out.setdefault(s.node_rank, []).append(s.group_id)
    return out


def free_gpus(fake, node_rank: int) -> float:
    node = sorted(fake.nodes_by_id.values(), key=lambda n: n.info.ip)[node_rank]
    return node.free.get("GPU", 0.0)


def test_grow_onto_a_new_node_keeps_every_old_slot_and_untouched_assignments():
    async def go():
        fake = cluster(gpu_nodes=3, gpus=4)
        ctl = await controller(fake)
        await ctl.reserve(
            "j", {"num_nodes": 4, "component_placement": {"actor": "0-3", "rollout": "4-7"}}, 5
        )
        before = stored(fake, "j")
        actor_before = published(fake, "j").components["actor"]
        got = summary(
            await ctl.apply(
                "j", {"num_nodes": 4, "component_placement": {"actor": "0-3", "rollout": "4-11"}}, 5
            )
        )
        after = stored(fake, "j")
        assert got.applied and got.epoch == after.epoch == 2
        assert (got.slots_kept, got.slots_created, got.slots_removed) == (2, 1, 0)
        assert after.slots[:2] == before.slots  # same groups, bundles, physical ids
        assert live_groups(fake) == table_groups(fake) == after.group_ids()
        comps = {c.name: c for c in got.components}
        assert comps["rollout"].stays == [0, 1, 2, 3] and comps["rollout"].starts == [4, 5, 6, 7]
        assert comps["rollout"].restart == "world size 4 -> 8"
        assert comps["actor"].stays == [0, 1, 2, 3] and not comps["actor"].restart
        # the untouched component's assignments are the same, byte for byte, epoch too
        assert published(fake, "j").components["actor"] == actor_before
        rollout = published(fake, "j").components["rollout"]
        assert {a.epoch for a in rollout} == {2}
        await ctl.stop()

    run(go())


def test_grow_within_a_node_adds_a_slot_and_shrink_back_frees_exactly_it():
    async def go():
        fake = cluster(gpu_nodes=2, gpus=8)
        ctl = await controller(fake)
        await ctl.reserve("j", conf(rollout="0-3"), 5)
        first = groups_by_rank(fake, "j")
        await ctl.apply("j", conf(rollout="0-7"), 5)
        grown = groups_by_rank(fake, "j")
        assert grown[1][0] == first[1][0] and len(grown[1]) == 2
        assert free_gpus(fake, 1) == 0
        await ctl.apply("j", conf(rollout="0-3"), 5)
        assert groups_by_rank(fake, "j") == first
        assert free_gpus(fake, 1) == 4  # exactly the added GPUs came back
        await ctl.reserve("other", conf(actor="4-7"), 5)  # another job takes them at once
        assert stored(fake, "j").epoch == 3
        await ctl.stop()

    run(go())


def test_dry_run_and_the_same_spec_change_nothing():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("j", conf(actor="0-3"), 5)
        before = table(fake)
        plan = summary(await ctl.apply("j", conf(actor="0-7"), 5, True))
        assert not plan.applied and plan.components[0].starts == [4, 5, 6, 7]
        assert table(fake) == before
        again = summary(await ctl.apply("j", conf(actor="0-3"), 5))
        assert again.epoch == 1 and "already" in again.note and table(fake) == before
        await ctl.stop()

    run(go())


def test_an_apply_that_cannot_be_placed_leaves_the_reservation_as_it_was():
    async def go():
        fake = cluster(gpu_nodes=3, gpus=4)
        ctl = await controller(fake)
        spec4 = {"num_nodes": 4, "component_placement": {"actor": "0-3"}}
        await ctl.reserve("j", spec4, 5)
        await ctl.reserve("other", {"num_nodes": 4, "component_placement": {"x": "8-11"}}, 5)
        before, groups = table(fake), live_groups(fake)
        grown = {"num_nodes": 4, "component_placement": {"actor": "0-11"}}
        with pytest.raises(ReservationTimeout, match="needs"):
            await ctl.apply("j", grown, 0.3)
        assert table(fake) == before and live_groups(fake) == groups
        with pytest.raises(PlacementError):  # more GPUs than the cluster has at all
            await ctl.apply("j", {"num_nodes": 4, "component_placement": {"actor": "0-99"}}, 1)
        assert table(fake) == before and live_groups(fake) == groups
        await ctl.stop()

    run(go())


def test_shrinking_inside_a_full_slot_rebuilds_it_and_moves_its_ranks():
    async def go():
        fake = cluster(gpu_nodes=2, gpus=4)
        ctl = await controller(fake)
        await ctl.reserve("j", conf(actor="0-3"), 5)
        old = groups_by_rank(fake, "j")[1]
        got = summary(await ctl.apply("j", conf(actor="0-1"), 5))
        assert got.rebuilt_nodes == [1]
        (actor,) = got.components
        assert (actor.moves, actor.stops, actor.restart) == ([0, 1], [2, 3], "world size 4 -> 2")
        new = groups_by_rank(fake, "j")[1]
        assert len(new) == 1 and new != old
        assert free_gpus(fake, 1) == 2 and live_groups(fake) == table_groups(fake)
        await ctl.stop()

    run(go())


def test_a_process_that_would_span_two_slots_gets_one():
    async def go():
        fake = cluster(gpu_nodes=2, gpus=8)
        ctl = await controller(fake)
        await ctl.reserve("j", conf(engine="0-1"), 5)
        await ctl.apply("j", conf(engine="0-3:0"), 5)  # one process on GPUs 0-3
        (a,) = published(fake, "j").components["engine"]
        rec = stored(fake, "j")
        (slot,) = [s for s in rec.slots if s.group_id == a.placement_group_id]
        assert len(rec.slots) == 1 and len(a.bundle_indices) == 4
        # made beside the old slot (there was room), then the old one went
        assert len({slot.bundles[i].physical_id for i in a.bundle_indices}) == 4
        assert free_gpus(fake, 1) == 4 and live_groups(fake) == table_groups(fake)
        await ctl.stop()

    run(go())


def test_resize_and_move_are_applies_of_one_component():
    async def go():
        fake = cluster(gpu_nodes=3, gpus=4)
        four = {
            "num_nodes": 4,
            "node_groups": [{"label": "a", "node_ranks": "1"}, {"label": "b", "node_ranks": "2-3"}],
            "component_placement": {"actor,rollout": {"node_group": "a", "placement": "0-3"}},
        }
        ctl = await controller(fake)
        await ctl.reserve("j", four, 5)
        got = summary(await ctl.resize("j", "rollout", None, "b"))
        comps = {c.name: c for c in got.components}
        assert comps["rollout"].moves == [0, 1, 2, 3] and comps["actor"].stays == [0, 1, 2, 3]
        got = summary(await ctl.resize("j", "rollout", "0-7"))
        assert {c.name: c for c in got.components}["rollout"].starts == [4, 5, 6, 7]
        rec = stored(fake, "j")
        assert rec.spec.component("rollout").node_groups == ["b"] and rec.epoch == 3
        with pytest.raises(PlacementError, match="unknown component 'critic'"):
            await ctl.resize("j", "critic", "0-1")
        with pytest.raises(PlacementError, match="unknown node group 'c'"):
            await ctl.resize("j", "rollout", None, "c")
        await ctl.stop()

    run(go())


def test_apply_needs_a_ready_reservation():
    async def go():
        fake = cluster(gpu_nodes=2)
        ctl = await controller(fake)
        await ctl.reserve("j", conf(actor="0-7"), 5)
        fake.kill_node(stored(fake, "j").slots[1].node_id)
        await until(lambda: stored(fake, "j").state == "degraded")
        with pytest.raises(ReservationError, match="needs a ready reservation; it is degraded"):
            await ctl.apply("j", conf(actor="0-3"), 1)
        await ctl.stop()

    run(go())


STEPS = [
    "apply_after_intent",
    "apply_after_create",
    "apply_after_probe",
    "apply_after_write",
]


@pytest.mark.parametrize("step", STEPS)
def test_a_crash_at_each_step_of_apply_leaves_the_old_or_the_new_reservation(step):
    async def go():
        fake = cluster(gpu_nodes=3, gpus=4)
        old_spec = {"num_nodes": 4, "component_placement": {"actor": "0-3", "rollout": "4-7"}}
        new_spec = {"num_nodes": 4, "component_placement": {"actor": "0-3", "rollout": "4-11"}}
        ctl = await controller(fake)
        await ctl.reserve("j", old_spec, 5)
        old = stored(fake, "j")
        await ctl.arm_fault(step)
        with pytest.raises(SimulatedCrash):
            await ctl.apply("j", new_spec, 5)
        await ctl.stop()
        ctl2 = await controller(fake)
        rec = stored(fake, "j")
        assert rec.applying is None
        if step == "apply_after_write":
            assert rec.epoch == 2 and rec.slots[:2] == old.slots
        else:
            assert rec == old
        await until(lambda: live_groups(fake) == table_groups(fake))
        # Ray's retry of the call finds the new reservation, or makes it
        got = summary(await ctl2.apply("j", new_spec, 5))
        assert got.applied and stored(fake, "j").epoch == 2
        assert live_groups(fake) == table_groups(fake)
        await ctl2.stop()

    run(go())


def test_a_crash_after_a_rebuild_removed_its_slot_rolls_back_and_the_repair_restores_it():
    async def go():
        fake = cluster(gpu_nodes=2, gpus=4)
        ctl = await controller(fake)
        await ctl.reserve("j", conf(actor="0-3"), 5)
        old = stored(fake, "j")
        await ctl.arm_fault("apply_after_rebuild_removal")
        with pytest.raises(SimulatedCrash):
            await ctl.apply("j", conf(actor="0-1"), 5)
        await ctl.stop()
        ctl2 = await controller(fake)
        rec = await until(lambda: (r := stored(fake, "j")).state == "ready" and r.epoch == 2 and r)
        assert rec.spec == old.spec and rec.applying is None
        await until(lambda: live_groups(fake) == table_groups(fake))
        assert free_gpus(fake, 1) == 0
        await ctl2.stop()

    run(go())


def test_a_repair_keeps_the_untouched_ranks_assignments_byte_for_byte():
    async def go():
        fake = cluster(gpu_nodes=3, gpus=4)
        ctl = await controller(fake)
        await ctl.reserve(
            "j", {"num_nodes": 4, "component_placement": {"actor": "0-3", "rollout": "4-7"}}, 5
        )
        actor = published(fake, "j").components["actor"]
        fake.kill_node(stored(fake, "j").slots[1].node_id)  # rollout's node
        await until(lambda: (r := stored(fake, "j")).epoch == 2 and r.state == "ready")
        assert published(fake, "j").components["actor"] == actor
        assert {a.epoch for a in published(fake, "j").components["rollout"]} == {2}
        await ctl.stop()

    run(go())


def test_sync_plans_from_the_assignments_a_group_was_started_with():
    from clients.render import render_apply
    from clients.sync import plan_sync

    async def go():
        fake = cluster(gpu_nodes=2, gpus=8)
        ctl = await controller(fake)
        await ctl.reserve("j", conf(actor="0-3", rollout="0-3"), 5)
        old = published(fake, "j").components
        text = render_apply(summary(await ctl.apply("j", conf(actor="0-3", rollout="0-5"), 5)))
        assert "rollout: 4 -> 6 ranks; stay 0-3, start 4-5; needs a new process group" in text
        new = published(fake, "j").components
        grow = plan_sync("rollout", 2, old["rollout"], new["rollout"])
        assert (grow.kept, grow.started, grow.restart_needed) == (
            [0, 1, 2, 3],
            [4, 5],
            "world size 4 -> 6",
        )
        assert plan_sync("actor", 2, old["actor"], new["actor"]).kept == [0, 1, 2, 3]
        # moving the actor to other GPUs: every rank moves, rank 0 with them
        await ctl.apply("j", conf(actor="4-7", rollout="0-5"), 5)
        moved = plan_sync("actor", 3, new["actor"], published(fake, "j").components["actor"])
        assert (moved.moved, moved.restart_needed) == ([0, 1, 2, 3], "rank 0 moved")
        await ctl.stop()

    run(go())


def test_the_status_map_shows_a_node_with_two_groups_as_one_row():
    from clients.render import render_reservation
    from controller.state.published import summarize

    async def go():
        fake = cluster(gpu_nodes=2, gpus=8)
        ctl = await controller(fake)
        await ctl.reserve("j", conf(rollout="0-3"), 5)
        await ctl.apply("j", conf(rollout="0-7"), 5)
        rec = stored(fake, "j")
        text = render_reservation(summarize(rec), published(fake, "j").components)
        first, second = (s.group_id for s in rec.slots)
        assert text.splitlines()[0] == "j: ready, epoch 2, 1 node(s), 8 GPU"
        assert f"groups {first}, {second}" in text
        cells = [line.split() for line in text.splitlines()[2:]]
        assert cells == [[f"GPU{g}", f"rollout:{g}"] for g in range(8)]
        await ctl.stop()

    run(go())


def test_a_published_block_round_trips_through_its_assignments():
    from controller.state.published import ComponentBlock, _block
    from controller.state.table import component_key

    async def go():
        fake = cluster(gpu_nodes=2, gpus=4)
        ctl = await controller(fake)
        conf2 = conf(actor="0-3", engine={"placement": "4-7:0-1", "capture_child_tasks": True})
        await ctl.reserve("j", conf2, 5)
        await ctl.apply(
            "j",
            {**conf2, "component_placement": {**conf2["component_placement"], "actor": "0-1"}},
            5,
        )
        rec = stored(fake, "j")
        for name in rec.world_sizes:
            block = msgspec.msgpack.decode(fake.kv[component_key("j", name)], type=ComponentBlock)
            assert _block(rec, name, block.assignments()) == block
        await ctl.stop()

    run(go())


def test_an_apply_that_can_never_fit_beside_what_it_keeps_is_refused_at_once():
    # The kept slot holds all 4 CPUs of node 1; a node-level process added there would
    # make 5. Refused before anything is written or made, not after the timeout.
    async def go():
        fake = cluster(gpu_nodes=2, gpus=4)
        ctl = await controller(fake)
        await ctl.reserve("j", conf(actor="0-3"), 5)
        before, groups = table(fake), live_groups(fake)
        more = conf(actor="0-3", reward={"node_group": "node", "placement": "1"})
        for dry_run in (True, False):
            with pytest.raises(ReservationInfeasible, match="would need CPU 5; it has CPU 4"):
                await ctl.apply("j", more, 30, dry_run)
        assert table(fake) == before and live_groups(fake) == groups
        await ctl.apply("j", conf(actor="0-2", reward={"node_group": "node", "placement": "1"}), 5)
        assert stored(fake, "j").epoch == 2  # one GPU fewer leaves room for it
        await ctl.stop()

    run(go())
