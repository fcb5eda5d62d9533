"""Readiness is true: nothing answers ``ready`` for a reservation on a node Ray reports
dead, not even in the moment before the controller's loop has seen Ray's event. These
tests take the event away (a subscription that lags) so that only a question to Ray's
node table can tell; observations go through what drivers read."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from clients.reservation import Reservation
from clients.session import Controller
from clients.testing.fake_table import DriverTable
from controller.errors import ReservationDegraded, ReservationTimeout
from controller.runtime.core.settings import FAST
from tests.unit.fakes import cluster, controller, info, run, spec, stored, until

# No periodic tick: whatever happens, happens because a call or an event woke the loop.
IDLE = msgspec.structs.replace(FAST, reconcile_period=60.0, full_check_period=600.0)


def lose_node_silently(fake, node_id: str) -> None:
    """The node dies; Ray's table says so, but its event has not reached the loop."""
    fake.kill_node(node_id)
    fake.events.clear()


def test_status_never_answers_ready_for_a_node_ray_reports_dead():
    async def go():
        fake = cluster()
        ctl = await controller(fake, IDLE)
        await ctl.reserve("j", spec("0-5"), 5)
        lost = stored(fake, "j").slots[0]
        lose_node_silently(fake, lost.node_id)
        got = info(await ctl.status("j"))
        assert got.state == "degraded" and lost.node_ip in got.reason
        listed = msgspec.msgpack.decode(await ctl.list())
        assert [r["state"] for r in listed] == ["degraded"]
        # The call recorded it and woke the loop, which repairs with no periodic tick.
        rec = await until(lambda: (r := stored(fake, "j")).state == "ready" and r.epoch == 2 and r)
        assert lost.node_id not in rec.node_ids()
        await ctl.stop()

    run(go())


def test_a_node_event_wakes_the_loop_at_once():
    async def go():
        fake = cluster()
        ctl = await controller(fake, IDLE)
        await ctl.reserve("j", spec("0-3"), 5)
        fake.kill_node(stored(fake, "j").slots[0].node_id)
        await until(lambda: (r := stored(fake, "j")).state == "ready" and r.epoch == 2, 2.0)
        await ctl.stop()

    run(go())


def test_reserve_of_the_same_spec_repairs_before_it_returns():
    async def go():
        fake = cluster()
        ctl = await controller(fake, IDLE)
        await ctl.reserve("j", spec("0-5"), 5)
        lost = stored(fake, "j").slots[1].node_id
        lose_node_silently(fake, lost)
        got = info(await ctl.reserve("j", spec("0-5"), 5))
        assert got.state == "ready" and got.epoch == 2
        assert lost not in {s.node_id for s in got.slots}
        assert all(fake.nodes_by_id[s.node_id].info.alive for s in got.slots)
        await ctl.stop()

    run(go())


def test_reserve_of_the_same_spec_under_manual_repair_answers_degraded():
    async def go():
        fake = cluster()
        ctl = await controller(fake, IDLE)
        await ctl.reserve("j", spec("0-3"), 5, repair="manual")
        lose_node_silently(fake, stored(fake, "j").slots[0].node_id)
        got = info(await ctl.reserve("j", spec("0-3"), 5, repair="manual"))
        assert got.state == "degraded" and got.epoch == 1
        assert "manual" in stored(fake, "j").reason
        await ctl.stop()

    run(go())


def test_reserve_without_a_spare_times_out_and_keeps_the_reservation():
    async def go():
        fake = cluster(gpu_nodes=2)
        ctl = await controller(fake, IDLE)
        await ctl.reserve("j", spec("0-7"), 5)
        lose_node_silently(fake, stored(fake, "j").slots[0].node_id)
        with pytest.raises(ReservationTimeout, match=r"not repaired in time.*no spare node"):
            await ctl.reserve("j", spec("0-7"), 0.3)
        rec = stored(fake, "j")
        assert rec.state == "degraded" and rec.epoch == 1
        fake.add_node(num_gpus=4, num_cpus=4)  # a spare joins: repaired
        await until(lambda: (r := stored(fake, "j")).state == "ready" and r.epoch == 2)
        await ctl.stop()

    run(go())


def test_repair_call_counts_a_node_ray_reports_dead():
    async def go():
        fake = cluster()
        ctl = await controller(fake, IDLE)
        await ctl.reserve("j", spec("0-3"), 5, repair="manual")
        lose_node_silently(fake, stored(fake, "j").slots[0].node_id)
        got = info(await ctl.repair("j"))
        assert got.state == "ready" and got.epoch == 2
        await ctl.stop()

    run(go())


def test_a_driver_sees_the_dead_node_before_the_table_does():
    async def go():
        fake = cluster()
        ctl = await controller(fake, IDLE)
        await ctl.reserve("j", spec("0-5"), 5)
        await ctl.stop()  # nobody will write the table: only Ray knows
        res = Reservation(Controller(None, table=DriverTable(fake)), stored(fake, "j"))
        assert res.refresh().state == "ready"
        assert len(res.assignments("actor")) == 6
        lost = stored(fake, "j").slots[0]
        fake.kill_node(lost.node_id)
        assert stored(fake, "j").state == "ready"  # the table still says so
        seen = res.refresh()
        assert seen.state == "degraded" and lost.node_ip in seen.reason
        with pytest.raises(ReservationDegraded, match="wait_ready"):
            res.assignments("actor")
        survivors = res.assignments("actor", allow_degraded=True)
        assert len(survivors) == 6
        with pytest.raises(ReservationTimeout, match=r"degraded.*dead"):
            res.wait_ready(timeout=0.05, progress=lambda m: None)

    run(go())


def test_wait_ready_newer_than_waits_for_a_later_epoch():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-3"), 5)
        res = Reservation(Controller(None, table=DriverTable(fake)), stored(fake, "j"))
        assert res.wait_ready(timeout=1).epoch == 1
        with pytest.raises(ReservationTimeout, match="waiting for one after 1"):
            res.wait_ready(timeout=0.05, newer_than=1, progress=lambda m: None)
        fake.kill_node(stored(fake, "j").slots[0].node_id)
        await until(lambda: stored(fake, "j").epoch == 2)
        await asyncio.sleep(0)
        got = res.wait_ready(timeout=1, newer_than=1)
        assert got.epoch == 2 and got.state == "ready"
        await ctl.stop()

    run(go())
