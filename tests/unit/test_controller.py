"""The controller's logic on the in-memory fake cluster: lifecycle, recovery, persistence
and its failures, reserve and release (repairs and sweeps: ``test_repairs``). Milliseconds
each; observations go through the stored table (what drivers read), not the controller's
memory."""

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
from controller.runtime.core.settings import FAST
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
        assert fake.metrics.readable is False  # what an operator's alert fires on
        fake.kill_node(stored(fake, "keep").slots[0].node_id)
        await asyncio.sleep(0.2)
        assert stored(fake, "keep").epoch == 1  # no repair either
        del fake.kv[k]  # an operator moves the key aside: the controller resumes
        await until(lambda: stored(fake, "keep").epoch == 2)
        assert (await ctl2.health())["refusal"] is None
        await until(lambda: fake.metrics.readable)
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
        records = []

        async def gate(key: bytes) -> None:  # the intent is written; the record's last fails
            records.extend([key] if key == b"res/j" else [])
            fake.fail_kv_writes = int(len(records) == 2)

        fake.write_gate = gate
        with pytest.raises(PersistenceError):
            await ctl.reserve("j", spec("0-3"), 5)
        fake.write_gate = None
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


def test_release_ends_what_the_workers_left_on_its_nodes_and_nothing_else():
    async def go():
        fake = cluster()
        ctl = await controller(fake, msgspec.structs.replace(FAST, leftovers_timeout=2.0))
        await ctl.reserve("j", spec("0-3"), 5), await ctl.reserve("k", spec("4-7"), 5)
        j, k = stored(fake, "j"), stored(fake, "k")
        (mine,), (other,) = j.slots, k.slots
        fake.nodes_by_id[mine.node_id].left = {"vllm serve": f"{j.uid}:j.actor.0:aa"}
        fake.nodes_by_id[other.node_id].left = {"sglang": f"{k.uid}:k.actor.0"}
        assert await ctl.release("j") is True
        assert fake.nodes_by_id[mine.node_id].left == {}
        assert fake.nodes_by_id[other.node_id].left == {"sglang": f"{k.uid}:k.actor.0"}
        # A node that never answers holds the release for leftovers_timeout, no longer; the
        # record (and `list`'s line) goes before that, with the groups.
        fake.nodes_by_id[other.node_id].answers = False
        releasing = asyncio.ensure_future(ctl.release("k"))
        await until(lambda: stored(fake, "k") is None)
        assert msgspec.msgpack.decode(await ctl.list()) == [] and not releasing.done()
        assert await releasing is True
        assert fake.nodes_by_id[other.node_id].left == {"sglang": f"{k.uid}:k.actor.0"}
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
