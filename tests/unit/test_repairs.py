"""What the controller's loop repairs and sweeps, on the in-memory fake cluster: slots of lost
nodes replaced from spares of the same kind (or waiting for one), groups removed behind its
back made again, a repair cut short at each step, the manual policy, and orphaned groups
removed while groups being made are kept."""

from __future__ import annotations

import asyncio

import pytest

from tests.unit.fakes import (
    cluster,
    controller,
    info,
    live_groups,
    run,
    spec,
    stored,
    table_groups,
    until,
)


@pytest.mark.parametrize(
    "step",
    ["replace_after_plan", "replace_after_create", "replace_after_probe", "replace_after_write"],
)
def test_a_crash_at_each_step_of_a_repair(step):
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-3"), 5)
        lost = stored(fake, "j").slots[0].node_id
        await ctl.arm_fault(step)
        fake.kill_node(lost)
        await until(lambda: ctl.finished)
        await ctl.stop()
        ctl2 = await controller(fake)
        rec = await until(lambda: (r := stored(fake, "j")).state == "ready" and r.epoch == 2 and r)
        assert lost not in rec.node_ids()
        on_lost = {g for g in live_groups(fake) if fake.groups_by_id[g].node_id == lost}
        await until(lambda: live_groups(fake) - on_lost == table_groups(fake))
        await ctl2.stop()

    run(go())


def test_a_group_removed_behind_our_back_is_found_by_the_full_check_and_made_again():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-3"), 5)
        (slot,) = stored(fake, "j").slots
        fake.remove_group_behind_back(slot.group_id)  # no node event reports this
        rec = await until(lambda: (r := stored(fake, "j")).epoch == 2 and r.state == "ready" and r)
        (again,) = rec.slots
        assert again.node_id == slot.node_id and again.group_id != slot.group_id
        assert live_groups(fake) == {again.group_id}
        await ctl.stop()

    run(go())


def test_no_spare_stays_degraded_then_a_joining_node_repairs_it():
    async def go():
        fake = cluster(gpu_nodes=2)
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-7"), 5)
        fake.kill_node(stored(fake, "j").slots[1].node_id)
        rec = await until(lambda: "no spare node" in stored(fake, "j").reason and stored(fake, "j"))
        assert rec.state == "degraded" and rec.epoch == 1
        fake.add_node(num_gpus=4, num_cpus=4)
        rec = await until(lambda: (r := stored(fake, "j")).state == "ready" and r)
        assert rec.epoch == 2
        await ctl.stop()

    run(go())


def test_a_spare_of_another_kind_is_never_used():
    async def go():
        fake = cluster(gpu_nodes=0)
        a100 = {"labels": {"ray.io/accelerator-type": "A100"}}
        fake.add_node(num_gpus=4, num_cpus=4, **a100)
        fake.add_node(num_gpus=4, num_cpus=4, labels={"ray.io/accelerator-type": "H100"})
        spot = {"ray.io/market-type": "SPOT", **a100["labels"]}
        fake.add_node(num_gpus=4, num_cpus=4, labels=spot)
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-3"), 5)
        fake.kill_node(stored(fake, "j").slots[0].node_id)
        rec = await until(lambda: "no spare node" in stored(fake, "j").reason and stored(fake, "j"))
        assert rec.state == "degraded"
        good = fake.add_node(num_gpus=4, num_cpus=4, **a100)
        rec = await until(lambda: (r := stored(fake, "j")).state == "ready" and r)
        assert rec.slots[0].node_id == good
        await ctl.stop()

    run(go())


def test_manual_repair_policy_waits_for_repair():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-3"), 5, repair="manual")
        fake.kill_node(stored(fake, "j").slots[0].node_id)
        await until(lambda: stored(fake, "j").state == "degraded")
        await asyncio.sleep(0.2)
        assert stored(fake, "j").epoch == 1
        got = info(await ctl.repair("j"))
        assert got.state == "ready" and got.epoch == 2
        await ctl.stop()

    run(go())


def test_hardware_named_in_another_case_asks_for_the_clusters_name():
    async def go():
        fake = cluster(gpu_nodes=1)
        fake.add_node(num_cpus=2, resources={"franka": 2})
        ctl = await controller(fake)
        conf = {
            "num_nodes": 3,
            "node_groups": [{"label": "arm", "node_ranks": 2, "hardware": {"type": "Franka"}}],
            "component_placement": {"env": {"node_group": "arm", "placement": "0-1"}},
        }
        await ctl.reserve("r", conf, 2)
        rec = stored(fake, "r")
        assert [set(b.resources) for b in rec.slots[0].bundles] == [{"franka", "CPU"}] * 2
        await ctl.stop()

    run(go())


def test_orphans_are_removed_on_recovery_and_foreign_groups_kept():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.stop()
        node = fake.alive()[1]
        orphan = await fake.create_group("placectl:placectl:ghost:abc:0", [{"CPU": 0.1}], node)
        foreign = await fake.create_group("someone-else", [{"CPU": 0.1}], node)
        ctl2 = await controller(fake)
        assert orphan not in live_groups(fake) and foreign in live_groups(fake)
        await ctl2.stop()

    run(go())


def test_a_running_controller_sweeps_orphans_but_not_groups_a_repair_is_making():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-3"), 5)
        node = fake.alive()[1]
        # A removal Ray never confirmed leaves a group no record names; no restart comes.
        orphan = await fake.create_group("placectl:placectl:ghost:abc:0", [{"CPU": 0.1}], node)
        await until(lambda: orphan not in live_groups(fake))
        # A slow replacement: its new group lives for a while before the record names it.
        fake.probe_delay = 0.1
        made_during = set()

        def watch():
            extra = live_groups(fake) - table_groups(fake)
            made_during.update(extra)
            r = stored(fake, "j")
            return r.epoch == 2 and r.state == "ready" and r

        fake.kill_node(stored(fake, "j").slots[0].node_id)
        rec = await until(watch)
        assert made_during & rec.group_ids(), "the repair's group was never seen unrecorded"
        assert live_groups(fake) >= rec.group_ids()
        await ctl.stop()

    run(go())
