"""Held spares (``cluster.spares``) in a shared cluster's queues, on the in-memory fake
cluster: they count in their queue's usage, against its quota at admission and when the
Holder takes them, and preemption takes them back with the reservation holding them,
as it would its slots."""

from __future__ import annotations

import asyncio

import msgspec

from clients.render import render_reservation
from controller.state.events import Event
from controller.state.queueing import usage
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
from tests.unit.test_held_spares import held, with_spares


def test_held_spares_count_in_their_queues_usage():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake)
        await ctl.reserve("j", with_spares(1), 5)
        rec = await held(fake, "j")
        (used,) = usage([rec], {}, now=0.0)
        assert used.used["GPU"] == 8  # its node's 4 and the held spare's 4
        await ctl.stop()

    run(go())


def test_a_queue_quota_holds_only_the_spares_it_has_room_for():
    """Held spares count against their queue's quota like slots (#59): a reservation of
    4 GPUs asking for 2 spares of 4 in a queue of 8 holds one, and says why in its
    status and its history."""

    async def go():
        fake = cluster(gpu_nodes=4)
        ctl = await controller(fake)
        await ctl.set_quota("team", {"GPU": 8}, force=True)
        await ctl.reserve("j", with_spares(2), 5, queue="team")
        rec = await held(fake, "j", 1)
        for _ in range(20):  # the Holder tries again; it never goes past the quota
            await asyncio.sleep(0.05)
        rec = stored(fake, "j")
        assert len(rec.spares) == 1
        (used,) = usage([rec], {"team": {"GPU": 8}}, now=0.0)
        assert used.used["GPU"] == 8
        why = "queue 'team''s quota leaves room for 0 more"
        shown = info(await ctl.status("j"))
        assert shown.spares_short == why
        assert f"spares: 1 of 2 held: {rec.spares[0].node_ip}" in render_reservation(shown, {})
        assert render_reservation(shown, {}).endswith(f"; fewer: {why}")
        got = msgspec.msgpack.decode(await ctl.events("j"), type=list[Event])
        told = [e.message for e in got if e.kind == "spares"]
        assert told[-1] == f"spares: 1 of 2 held ({rec.spares[0].node_ip}); fewer: {why}"
        await ctl.set_quota("team", {"GPU": 12}, force=True)  # room now: it takes the other
        rec = await held(fake, "j", 2)
        assert rec.spares_short == "" and info(await ctl.status("j")).spares_short == ""
        await ctl.stop()

    run(go())


def test_held_spares_count_at_admission_against_the_queues_quota():
    """A queue of 8 GPUs whose reservation holds 4 in slots and 4 in a held spare is at
    its quota: the next of its reservations waits, though a free node has room, and is
    admitted once the first is released (#59 item 4)."""

    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake)
        await ctl.set_quota("team", {"GPU": 8}, force=True)
        await ctl.reserve("one", with_spares(1), 5, queue="team")
        await held(fake, "one")
        # GPUs 8-11: node rank 3, the free node (rank 1 holds one's slot, rank 2 its spare)
        two = asyncio.create_task(ctl.reserve("two", spec("8-11", num_nodes=4), 10, queue="team"))
        why = await until(lambda: (w := ctl.ops.admitter.why("two")) and w[1])
        assert "queue 'team' is at its quota (GPU 8)" in why, why
        assert stored(fake, "two").state == "queued"
        await ctl.release("one")
        assert info(await asyncio.wait_for(two, 5)).state == "ready"
        await ctl.stop()

    run(go())


def test_preemption_takes_back_a_preemptible_reservations_held_spares_with_it():
    """A waiting job of higher priority that needs the node a preemptible reservation
    holds as a spare preempts it, as it would for a slot there; the spare's node is
    its own afterwards (#59 item 4)."""

    async def go():
        fake = cluster(gpu_nodes=2)
        ctl = await controller(fake)
        await ctl.reserve("low", with_spares(1), 5, priority=0, preemptible=True)
        rec = await held(fake, "low")
        vip = asyncio.create_task(ctl.reserve("vip", spec("0-7"), 10, queue="q", priority=5))
        low = await until(lambda: (r := stored(fake, "low")) is not None and r.preempt_at and r)
        assert "preempted for 'vip'" in low.reason
        got = info(await asyncio.wait_for(vip, 5))
        assert got.state == "ready" and stored(fake, "low") is None
        mine = {s.node_id for s in stored(fake, "vip").slots}
        assert rec.spares[0].node_id in mine and rec.slots[0].node_id in mine
        assert live_groups(fake) == table_groups(fake) == stored(fake, "vip").group_ids()
        await ctl.stop()

    run(go())
