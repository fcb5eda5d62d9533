"""The controller's logic on the in-memory fake cluster: lifecycle, recovery, reconcile,
repair, persistence and its failures. Milliseconds each; observations go through the
stored table (what drivers read), not the controller's memory."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from controller.errors import (
    PersistenceError,
    ReservationCancelled,
    ReservationConflict,
    ReservationError,
    ReservationInfeasible,
    ReservationTimeout,
    TableUnreadable,
)
from controller.runtime.controller import SimulatedCrash
from controller.state.records import SCHEMA_VERSION
from controller.state.table import LEGACY_BACKUP, LEGACY_KEY, META, RECORD, key
from tests.unit.fakes import (
    cluster,
    controller,
    info,
    live_groups,
    published,
    run,
    spec,
    stored,
    table,
    table_groups,
    until,
    write_v1,
)


def test_reserve_records_groups_probed_ids_and_published_assignments():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        got = info(await ctl.reserve("j", spec("0-5", rollout="0-5"), 5))
        assert got.state == "ready" and got.epoch == 1 and len(got.slots) == 2
        rec = stored(fake, "j")
        assert rec.state == "ready" and rec.group_ids() == live_groups(fake)
        assert [b.physical_id for s in rec.slots for b in s.bundles] == [0, 1, 2, 3, 0, 1]
        pub = published(fake, "j")
        assert (pub.uid, pub.epoch) == (rec.uid, rec.epoch)
        assert [a.placement.local_gpu_id for a in pub.components["actor"]] == [0, 1, 2, 3, 0, 1]
        await ctl.stop()

    run(go())


def test_the_loop_starts_with_the_actor_and_repairs_without_any_call():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-3"), 5)
        await ctl.stop()
        # A new incarnation that nobody calls: only the loop can notice the loss.
        ctl2 = await controller(fake)
        lost = stored(fake, "j").slots[0].node_id
        fake.kill_node(lost)
        rec = await until(lambda: (r := stored(fake, "j")).epoch == 2 and r.state == "ready" and r)
        assert lost not in rec.node_ids()
        assert live_groups(fake) == rec.group_ids()
        await ctl2.stop()

    run(go())


def test_unreadable_record_leaves_every_group_and_is_named_on_every_call():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("keep", spec("0-1"), 5)
        await ctl.reserve("newer", spec("2-3"), 5)
        await ctl.stop()
        groups_before = live_groups(fake)
        k = key(RECORD, "newer")
        future = msgspec.msgpack.decode(fake.kv[k])
        future["v"] = SCHEMA_VERSION + 1  # written by a newer placectl
        fake.kv[k] = msgspec.msgpack.encode(future)
        ctl2 = await controller(fake)
        await asyncio.sleep(0.2)  # many ticks: none may act
        assert live_groups(fake) == groups_before
        assert fake.kv[k] == msgspec.msgpack.encode(future)  # the bytes stay
        for call in (ctl2.list(), ctl2.status("keep"), ctl2.reserve("x", spec("0"), 1)):
            with pytest.raises(
                TableUnreadable, match=f"schema version {SCHEMA_VERSION + 1}, written by a newer"
            ):
                await call
        assert (await ctl2.health())["refusal"]
        fake.kill_node(stored(fake, "keep").slots[0].node_id)
        await asyncio.sleep(0.2)
        assert stored(fake, "keep").epoch == 1  # no repair either
        del fake.kv[k]  # an operator moves the key aside: the controller resumes
        await until(lambda: stored(fake, "keep").epoch == 2)
        assert (await ctl2.health())["refusal"] is None
        await ctl2.stop()

    run(go())


def test_newer_table_format_and_corrupt_bytes_are_refused_too():
    async def go():
        for meta, record in ((msgspec.msgpack.encode({"format": 3}), None), (None, b"\xc1")):
            fake = cluster()
            ctl = await controller(fake)
            await ctl.reserve("j", spec("0-1"), 5)
            await ctl.stop()
            before = live_groups(fake)
            if meta:
                fake.kv[META] = meta
            if record:
                fake.kv[key(RECORD, "j")] = record
            ctl2 = await controller(fake)
            with pytest.raises(TableUnreadable):
                await ctl2.list()
            await asyncio.sleep(0.05)
            assert live_groups(fake) == before
            await ctl2.stop()

    run(go())


def test_format_1_table_is_migrated_and_its_groups_kept():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-5"), 5)
        await ctl.stop()
        rec = stored(fake, "j")
        # Rewrite the GCS as placectl 0.1 left it: one key, its own schema.
        write_v1(fake, {"j": rec})
        ctl2 = await controller(fake)
        assert LEGACY_KEY not in fake.kv and LEGACY_BACKUP in fake.kv
        again = stored(fake, "j")
        assert again.group_ids() == rec.group_ids() == live_groups(fake)
        assert again.epoch == rec.epoch and again.state == "ready"
        old = {(s.node_id, b.physical_id): s.group_id for s in rec.slots for b in s.bundles}
        for a in published(fake, "j").components["actor"]:
            p = a.placement
            assert a.placement_group_id == old[(p.node_id, p.local_gpu_id)]
        await ctl2.stop()

    run(go())


def test_a_new_reservation_of_the_same_name_has_a_new_uid_and_a_higher_epoch():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        first = info(await ctl.reserve("j", spec("0-1"), 5))
        await ctl.release("j")
        second = info(await ctl.reserve("j", spec("0-1"), 5))
        third = info(await ctl.reserve("j", spec("0-2"), 5, True))  # replace
        assert [first.epoch, second.epoch, third.epoch] == [1, 2, 3]
        assert len({first.uid, second.uid, third.uid}) == 3
        await ctl.stop()
        ctl2 = await controller(fake)  # the count survives restarts and releases
        await ctl2.release("j")
        assert info(await ctl2.reserve("j", spec("0"), 5)).epoch == 4
        await ctl2.stop()

    run(go())


def test_a_failed_write_changes_nothing_and_the_loop_writes_it_later():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-3"), 5, repair="manual")
        fake.fail_kv_writes = 3
        fake.kill_node(stored(fake, "j").slots[0].node_id)
        await until(lambda: fake.fail_kv_writes == 0)
        assert ctl.state.get("j").state in ("ready", "degraded")
        rec = await until(lambda: (r := stored(fake, "j")).state == "degraded" and r)
        assert ctl.state.get("j") == rec  # memory equals the table
        assert "repair policy is manual" in rec.reason
        await ctl.stop()

    run(go())


def test_reserve_whose_last_write_fails_leaves_nothing_behind():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("other", spec("6-7"), 5)
        keep = live_groups(fake)
        writes = fake.calls["kv_put"]

        async def fail_soon():
            await until(lambda: fake.calls["kv_put"] >= writes + 2)  # intent, then the rest
            fake.fail_kv_writes = 1

        failer = asyncio.ensure_future(fail_soon())
        with pytest.raises(PersistenceError):
            await ctl.reserve("j", spec("0-3"), 5)
        await failer
        assert live_groups(fake) == keep and stored(fake, "j") is None
        await ctl.stop()

    run(go())


def test_release_is_done_only_when_ray_reports_the_groups_gone():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-3"), 5)
        gid = next(iter(stored(fake, "j").group_ids()))
        fake.slow_removal.add(gid)
        with pytest.raises(ReservationError, match="release of 'j' is not complete"):
            await ctl.release("j")
        assert stored(fake, "j").state == "releasing"
        fake.slow_removal.clear()
        await until(lambda: stored(fake, "j") is None)  # the loop finished it
        assert gid not in live_groups(fake)
        await ctl.stop()

    run(go())


def test_release_cancels_a_pending_reserve_and_nothing_is_left():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("hog", spec("0-11", num_nodes=4), 5)
        before = live_groups(fake)
        pending = asyncio.ensure_future(ctl.reserve("j", spec("0-1", num_nodes=4), 60))
        await until(lambda: stored(fake, "j") is not None)
        await until(lambda: len(live_groups(fake)) > len(before))  # its group waits
        assert await ctl.release("j") is True
        with pytest.raises(ReservationCancelled, match="cancelled"):
            await pending
        assert stored(fake, "j") is None and live_groups(fake) == before
        await ctl.stop()

    run(go())


def test_a_release_while_a_group_is_being_made_leaves_nothing():
    async def go():
        fake = cluster()
        fake.create_delay = 0.05
        ctl = await controller(fake)
        pending = asyncio.ensure_future(ctl.reserve("j", spec("0-7"), 5))
        await until(lambda: stored(fake, "j") is not None)
        await asyncio.sleep(0.01)  # inside the first creation
        assert await ctl.release("j") is True
        with pytest.raises(ReservationCancelled):
            await pending
        await asyncio.sleep(0.1)  # the creation has finished by now
        assert live_groups(fake) == set() and stored(fake, "j") is None
        await ctl.stop()

    run(go())


def test_timeout_names_the_node_and_leaves_nothing():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("hog", spec("4-7"), 5)
        with pytest.raises(ReservationTimeout, match=r"needs CPU 2, GPU 2; free CPU 0, GPU 0"):
            await ctl.reserve("j", spec("4-5"), 0.2)
        assert stored(fake, "j") is None and live_groups(fake) == table_groups(fake)
        await ctl.stop()

    run(go())


def test_same_spec_is_idempotent_other_spec_conflicts():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        a = info(await ctl.reserve("j", spec("0-3"), 5))
        assert info(await ctl.reserve("j", spec("0-3"), 5)) == a
        with pytest.raises(ReservationConflict, match="'0-3' -> '0-1'"):
            await ctl.reserve("j", spec("0-1"), 5)
        await ctl.stop()

    run(go())


@pytest.mark.parametrize(
    "step", ["after_plan", "after_create", "after_ready", "after_probe", "after_write"]
)
def test_a_crash_at_each_step_of_reserve_leaves_all_or_nothing(step):
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.arm_fault(step)
        with pytest.raises(SimulatedCrash):
            await ctl.reserve("j", spec("0-5"), 5)
        await ctl.stop()
        ctl2 = await controller(fake)
        rec = stored(fake, "j")
        assert rec is None or rec.state == "ready"
        assert live_groups(fake) == table_groups(fake)
        again = info(await ctl2.reserve("j", spec("0-5"), 5))  # Ray's retry of the call
        assert again.state == "ready" and live_groups(fake) == table_groups(fake)
        await ctl2.stop()

    run(go())


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


def test_bad_input_never_changes_state():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("steady", spec("0-1"), 5)
        before = table(fake)
        for call in (
            ctl.reserve("x" * 200, spec("0"), 1),
            ctl.reserve("y", 42, 1),
            ctl.reserve("y", spec("0"), float("nan")),
            ctl.reserve("y", spec("0"), 1, "yes"),
            ctl.reserve("y", spec("0"), 1, False, "sometimes"),
            ctl.lease_ports("steady", "actor", 0, 10**6, True, None, "r"),
            ctl.lease_ports("steady", "actor", "0", 1, True, None, "r"),
            ctl.lease_ports("steady", "nope", 0, 1, True, None, "r"),
            ctl.lease_ports("steady", "actor", 0, 1, True, None, None),
            ctl.release_ports("steady", "all"),
            ctl.assignments("steady", 7),
            ctl.arm_fault("nowhere"),
        ):
            with pytest.raises(ReservationError.__mro__[1]) as e:  # PlacementError
                await call
            assert "\n" not in str(e.value)
        assert table(fake) == before
        await ctl.stop()

    run(go())


def test_a_reservation_that_can_never_fit_is_refused_at_once():
    # The new user's case: all 4 GPUs of a node (1 CPU each) and a node-level process on
    # the same node ask for 5 CPUs of a node that has 4 in total. Ray would keep the
    # group pending forever; the reserve refuses it now, naming the node and the numbers.
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        started = asyncio.get_running_loop().time()
        with pytest.raises(ReservationInfeasible) as e:
            await ctl.reserve("j", spec("0-3", reward={"node_group": "node", "placement": "1"}), 30)
        assert asyncio.get_running_loop().time() - started < 5  # not its 30 s timeout
        message = str(e.value)
        assert "can never be placed" in message and "would need CPU 5" in message
        assert "it has CPU 4 in total" in message and "\n" not in message
        assert stored(fake, "j") is None and live_groups(fake) == set()
        await ctl.stop()

    run(go())


def test_a_reserve_waiting_for_what_others_hold_says_whose():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("hog", spec("4-7"), 5)
        with pytest.raises(ReservationTimeout, match=r"free CPU 0, GPU 0 \(held by hog\)"):
            await ctl.reserve("j", spec("4-5"), 0.2)
        await ctl.stop()

    run(go())
