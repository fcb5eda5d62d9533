"""Nodes that die without a word, on the fake cluster: Ray keeps calling them alive, and
only placectl's own raylet checks (controller.runtime.steps.liveness) can act before Ray's
health checks give up. Here Ray never gives up, so every repair below is placectl's."""

from __future__ import annotations

import asyncio

import msgspec

from controller.runtime.core.settings import FAST
from tests.unit.fakes import cluster, controller, info, run, spec, stored, until


async def _reserved(fake, settings=FAST):
    ctl = await controller(fake, settings)
    await ctl.reserve("j", spec("0-7", num_nodes=3))
    return ctl


def test_a_crashed_node_is_fenced_and_its_slot_replaced_while_ray_calls_it_alive():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await _reserved(fake)
        lost = stored(fake, "j").slots[0].node_id
        fake.crash_node(lost)  # abrupt: no event, Ray still lists the node alive
        record = await until(
            lambda: (r := stored(fake, "j")).epoch == 2 and r.state == "ready" and r
        )
        assert lost not in {s.node_id for s in record.slots}
        assert "refuses connections" in fake.fenced[lost]
        assert not fake.nodes_by_id[lost].info.alive  # Ray was told, not only placectl
        assert lost in (await ctl.health())["fenced"]
        await ctl.stop()

    run(go())


def test_a_hung_node_moves_after_it_stays_silent_and_is_fenced_after_its_grace():
    async def go():
        fake = cluster(gpu_nodes=3)
        # suspect_after is ten times the wait below: a loaded machine that stalls the loop
        # for a second still sees the node silent for less than suspect_after.
        settings = msgspec.structs.replace(FAST, suspect_after=2.0, fence_grace=20.0)
        ctl = await _reserved(fake, settings)
        hung = stored(fake, "j").slots[1].node_id
        fake.crash_node(hung, "silent")
        await asyncio.sleep(0.2)  # silent for less than suspect_after: still its slot
        assert hung not in fake.fenced and stored(fake, "j").epoch == 1
        assert await ctl.suspects("j") == [hung]
        await until(lambda: stored(fake, "j").epoch == 2, timeout=15)
        assert fake.fenced == {}  # suspected: its slot moved, the node is kept
        await until(lambda: hung in fake.fenced, timeout=30)  # its grace is over
        assert "has not answered" in fake.fenced[hung] and "grace" in fake.fenced[hung]
        fake.crash_node(hung, "ok")  # back from the dead: it stays fenced, gets nothing
        await asyncio.sleep(0.1)
        assert hung not in {s.node_id for s in stored(fake, "j").slots}
        await ctl.stop()

    run(go())


def test_a_node_that_answers_again_before_the_verdict_keeps_its_slot():
    async def go():
        fake = cluster(gpu_nodes=3)
        # Each silence is a tenth of suspect_after: a loop stalled for a second on a loaded
        # machine does not turn one into a verdict.
        settings = msgspec.structs.replace(FAST, suspect_after=1.5)
        ctl = await _reserved(fake, settings)
        slow = stored(fake, "j").slots[0].node_id
        for _ in range(5):  # silent for 0.15 s at a time, answering in between
            fake.crash_node(slow, "silent")
            await asyncio.sleep(0.15)
            fake.crash_node(slow, "ok")
            await asyncio.sleep(0.05)
        assert fake.fenced == {}
        record = stored(fake, "j")
        assert record.epoch == 1 and record.state == "ready"
        assert slow in {s.node_id for s in record.slots}
        await ctl.stop()

    run(go())


def test_status_right_after_an_abrupt_death_is_never_ready_on_the_dead_node():
    async def go():
        fake = cluster(gpu_nodes=3)
        slow_watch = msgspec.structs.replace(FAST, liveness_period=60.0)  # only calls ask
        ctl = await _reserved(fake, slow_watch)
        lost = stored(fake, "j").slots[0].node_id
        fake.crash_node(lost)
        status = info(await ctl.status("j"))  # the instant after: no watch has run
        assert status.state != "ready" or lost not in {s.node_id for s in status.slots}
        assert lost in fake.fenced
        await until(lambda: stored(fake, "j").epoch == 2)
        await ctl.stop()

    run(go())


def test_nodes_without_slots_and_the_head_are_not_watched():
    async def go():
        fake = cluster(gpu_nodes=4)
        ctl = await _reserved(fake)
        used = {s.node_id for s in stored(fake, "j").slots}
        spare = next(
            n for n in fake.alive() if n not in used and not fake.nodes_by_id[n].info.is_head
        )
        head = fake.own_node()
        fake.crash_node(spare)
        fake.crash_node(head, "silent")
        await asyncio.sleep(0.2)
        assert fake.fenced == {}  # Ray's own checks deal with those
        await ctl.stop()

    run(go())


def test_a_node_that_dies_while_its_group_waits_to_be_placed_is_planned_around():
    async def go():
        fake = cluster(gpu_nodes=4)
        ctl = await controller(fake)
        fake.create_delay = 0.05  # the groups exist a moment after they are asked for
        task = asyncio.ensure_future(ctl.reserve("j", spec("0-7", num_nodes=3), timeout_s=5))
        pending = await until(lambda: stored(fake, "j"))
        victim = pending.slots[0].node_id
        fake.kill_node(victim)  # its group, pinned there, can never be placed
        status = info(await task)
        assert status.state == "ready"
        assert victim not in {s.node_id for s in status.slots}
        assert stored(fake, "j").epoch > pending.epoch
        await ctl.stop()

    run(go())


def test_callers_who_suspect_a_node_at_once_fence_it_once():
    async def go():
        fake = cluster(gpu_nodes=3)
        slow_watch = msgspec.structs.replace(FAST, liveness_period=60.0)
        ctl = await _reserved(fake, slow_watch)
        calls = []
        real = fake.fence

        async def slow_fence(node_id, why):  # Ray's GCS stalls on a second one at once
            calls.append(node_id)
            await asyncio.sleep(0.05)
            await real(node_id, why)

        fake.fence = slow_fence
        lost = stored(fake, "j").slots[0].node_id
        fake.crash_node(lost)
        await asyncio.gather(*(ctl.suspects("j") for _ in range(4)))
        assert calls == [lost]
        await until(lambda: stored(fake, "j").epoch == 2)
        await ctl.stop()

    run(go())


def test_an_old_doubt_about_a_released_node_does_not_fence_it_later():
    async def go():
        fake = cluster(gpu_nodes=2)
        # suspect_after well above the short silences below, which a loaded machine may
        # stretch by a second; the wait after the release is longer than it.
        settings = msgspec.structs.replace(FAST, suspect_after=1.5)
        ctl = await _reserved(fake, settings)
        node = stored(fake, "j").slots[0].node_id
        fake.crash_node(node, "silent")  # a doubt, not yet a verdict
        await asyncio.sleep(0.1)
        await ctl.release("j")
        await asyncio.sleep(1.6)  # long enough that the old doubt would be a verdict
        fake.crash_node(node, "ok")
        await ctl.reserve("j", spec("0-7", num_nodes=3))
        assert node in {s.node_id for s in stored(fake, "j").slots}
        fake.crash_node(node, "silent")  # one short silence on the new reservation
        await asyncio.sleep(0.1)
        fake.crash_node(node, "ok")
        await asyncio.sleep(0.05)
        assert fake.fenced == {}
        await ctl.stop()

    run(go())


def test_a_refusal_an_earlier_sweep_saw_waits_only_for_what_is_left_of_its_confirmation():
    """A driver's repair() asks the controller's verdicts the instant its step fails. A
    raylet refusing connections is fenced once refused twice ``refused_confirm`` apart;
    when the loop's own sweep saw the first refusal, the call waits only for the rest."""

    async def go():
        fake = cluster(gpu_nodes=3)
        confirm = 1.0  # long, so that the wait is seen on the virtual clock
        settings = msgspec.structs.replace(
            FAST, liveness_period=0.25, refused_confirm=confirm, suspect_after=10.0
        )
        ctl = await _reserved(fake, settings)
        lost = stored(fake, "j").slots[0].node_id
        loop = asyncio.get_running_loop()
        fake.crash_node(lost)
        await asyncio.sleep(0.6)  # the loop's sweep (every 0.25 s) has seen one refusal
        assert lost not in fake.fenced
        started = loop.time()
        assert (await ctl.verdicts("j", [lost]))[lost] == "dead"
        waited = loop.time() - started
        assert waited < confirm - 0.3  # not a whole confirmation: what was left of it
        assert "refuses connections" in fake.fenced[lost]
        await ctl.stop()

    run(go())
