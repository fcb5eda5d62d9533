"""The queue: admission order, gang admission, no starvation, quotas; and the controller
on the fake cluster (queued records in the table, admission as others release, restarts,
cancellation, timeouts). Milliseconds each; observations go through the stored table."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from clients.testing.fake_cluster import FakeCluster
from controller.errors import (
    ReservationCancelled,
    ReservationError,
    ReservationInfeasible,
    ReservationTimeout,
)
from controller.state.published import QueueEntry
from controller.state.queueing import Entry, Holding, decide, victims
from tests.unit.fakes import (
    cluster,
    controller,
    info,
    live_groups,
    run,
    sha256,
    spec,
    stored,
    until,
)

GPU4 = {"GPU": 4.0}


def entry(job, nodes, priority=0, at=0.0, queue="q", gpus=4.0):
    return Entry(
        job=job,
        queue=queue,
        priority=priority,
        queued_at=at,
        needs={n: {"GPU": gpus} for n in nodes},
    )


# ------------------------------------------------------------------ the decision, pure
def test_priority_first_then_first_come_first_served():
    free = {"a": GPU4, "b": GPU4}
    entries = [entry("late", ["a"], at=2), entry("early", ["b"], at=1), entry("vip", ["a"], 5, 3)]
    d = decide(entries, free)
    assert d.admitted == ["vip", "early"]
    assert d.waiting["late"][0] == 1 and "waits behind" not in d.waiting["late"][1]


def test_admission_is_whole_or_nothing():
    d = decide([entry("big", ["a", "b"])], {"a": GPU4, "b": {"GPU": 2.0}})
    assert d.admitted == []
    assert "b needs GPU 4, has GPU 2 free" in d.waiting["big"][1]


def test_a_stream_of_small_jobs_never_passes_a_waiting_large_one_on_its_nodes():
    # big needs a and b; a is busy. Small jobs behind it that want b wait; one on c goes.
    free = {"a": {"GPU": 0.0}, "b": GPU4, "c": GPU4}
    entries = [entry("big", ["a", "b"], at=0)]
    entries += [entry(f"small{i}", ["b"], at=1 + i) for i in range(20)]
    entries.append(entry("elsewhere", ["c"], at=50))
    d = decide(entries, free, holders=lambda n: {"a": ["owner"]}.get(n, []))
    assert d.admitted == ["elsewhere"]
    assert "(held by owner)" in d.waiting["big"][1]
    assert all("waits behind big" in d.waiting[f"small{i}"][1] for i in range(20))
    # a frees up: big goes first, the small ones still wait (b is now big's)
    free = {"a": GPU4, "b": GPU4, "c": {"GPU": 0.0}}
    d = decide([e for e in entries if e.job != "elsewhere"], free)
    assert d.admitted == ["big"]


def test_a_quota_holds_its_queue_back_and_nothing_else():
    free = {"a": GPU4, "b": GPU4}
    entries = [entry("one", ["a"], queue="team"), entry("two", ["b"], queue="other")]
    d = decide(entries, free, quotas={"team": {"GPU": 4.0}}, used={"team": {"GPU": 2.0}})
    assert d.admitted == ["two"]
    assert "queue 'team' is at its quota (GPU 4)" in d.waiting["one"][1]


def test_an_entry_that_cannot_be_planned_waits_and_holds_nothing():
    free = {"a": GPU4}
    waiting = Entry(job="x", queue="q", why="waiting for nodes: 1 of 3 alive")
    d = decide([waiting, entry("y", ["a"], at=1)], free)
    assert d.admitted == ["y"] and d.waiting["x"] == (1, "waiting for nodes: 1 of 3 alive")


# ------------------------------------------------------------------ the controller
def q(placement: str, **more) -> dict:
    return spec(placement, **more)


async def _queued(ctl, job, placement, priority=0, queue="q", timeout=10.0):
    return asyncio.create_task(
        ctl.reserve(job, q(placement), timeout, queue=queue, priority=priority)
    )


def test_a_reservation_that_fits_is_placed_at_once_and_keeps_its_queue():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        got = info(await ctl.reserve("j", q("0-3"), 5, queue="research", priority=3))
        assert got.state == "ready" and (got.queue, got.priority) == ("research", 3)
        await ctl.stop()

    run(go())


def test_queued_jobs_are_admitted_in_priority_order_as_others_release():
    async def go():
        fake = cluster(gpu_nodes=2)
        ctl = await controller(fake)
        await ctl.reserve("holder", q("0-7"), 5)  # both GPU nodes
        low = await _queued(ctl, "low", "0-7", priority=0)  # both nodes
        await until(lambda: (r := stored(fake, "low")) is not None and r.state == "queued")
        high = await _queued(ctl, "high", "0-3", priority=5)
        await until(lambda: (r := stored(fake, "high")) is not None and r.state == "queued")
        # queued: recorded, nothing placed (no partial hold)
        assert stored(fake, "low").slots == [] and len(live_groups(fake)) == 2
        entries = msgspec.msgpack.decode(await ctl.queue(), type=list[QueueEntry])
        assert [(e.position, e.job) for e in entries] == [(1, "high"), (2, "low")]
        assert "held by holder" in entries[0].why and entries[0].wants.get("GPU") == 4.0
        await ctl.release("holder")
        got = info(await asyncio.wait_for(high, 5))
        assert got.state == "ready"
        # low needs high's node too: it waits, even though its other node is free
        await until(lambda: "held by high" in ctl.ops.admitter.why("low")[1])
        assert stored(fake, "low").state == "queued"
        await ctl.release("high")
        assert info(await asyncio.wait_for(low, 5)).state == "ready"
        await ctl.stop()

    run(go())


def test_first_come_first_served_within_a_priority():
    async def go():
        fake = cluster(gpu_nodes=1)
        ctl = await controller(fake)
        await ctl.reserve("holder", q("0-3", num_nodes=2), 5)
        first = asyncio.create_task(ctl.reserve("first", q("0-3", num_nodes=2), 10, queue="q"))
        await until(lambda: stored(fake, "first") is not None)
        second = asyncio.create_task(ctl.reserve("second", q("0-3", num_nodes=2), 10, queue="q"))
        await until(lambda: stored(fake, "second") is not None)
        await ctl.release("holder")
        assert info(await asyncio.wait_for(first, 5)).state == "ready"
        assert stored(fake, "second").state == "queued"
        await ctl.release("first")
        assert info(await asyncio.wait_for(second, 5)).state == "ready"
        await ctl.stop()

    run(go())


def test_queued_records_survive_a_controller_restart_and_are_placed_without_their_caller():
    async def go():
        fake = cluster(gpu_nodes=1)
        ctl = await controller(fake)
        await ctl.reserve("holder", q("0-3", num_nodes=2), 5)
        waiting = asyncio.create_task(ctl.reserve("w", q("0-3", num_nodes=2), 10, queue="q"))
        await until(lambda: (r := stored(fake, "w")) is not None and r.state == "queued")
        await ctl.stop()  # the controller dies; its caller's call with it
        waiting.cancel()
        again = await controller(fake)
        assert stored(fake, "w").state == "queued"
        await again.release("holder")
        rec = await until(lambda: (r := stored(fake, "w")) is not None and r.state == "ready" and r)
        assert rec.queue == "q" and rec.slots
        # the caller comes back with the same spec: it gets the placed reservation
        got = info(await again.reserve("w", q("0-3", num_nodes=2), 5, queue="q"))
        assert got.state == "ready" and got.uid == rec.uid
        await again.stop()

    run(go())


def test_cancel_or_release_leaves_the_queue():
    async def go():
        fake = cluster(gpu_nodes=1)
        ctl = await controller(fake)
        await ctl.reserve("holder", q("0-3", num_nodes=2), 5)
        task = asyncio.create_task(ctl.reserve("w", q("0-3", num_nodes=2), 10, queue="q"))
        await until(lambda: stored(fake, "w") is not None)
        assert await ctl.cancel("w")
        with pytest.raises(ReservationCancelled):
            await task
        assert stored(fake, "w") is None
        task = asyncio.create_task(ctl.reserve("w", q("0-3", num_nodes=2), 10, queue="q"))
        await until(lambda: stored(fake, "w") is not None)
        assert await ctl.release("w")
        with pytest.raises(ReservationCancelled):
            await task
        assert stored(fake, "w") is None
        await ctl.stop()

    run(go())


def test_a_timeout_leaves_the_queue_saying_where_it_was():
    async def go():
        fake = cluster(gpu_nodes=1)
        ctl = await controller(fake)
        await ctl.reserve("holder", q("0-3", num_nodes=2), 5)
        with pytest.raises(ReservationTimeout, match=r"number 1 in the queue .*held by holder"):
            await ctl.reserve("w", q("0-3", num_nodes=2), 0.3, queue="q")
        assert stored(fake, "w") is None
        await ctl.stop()

    run(go())


def test_what_can_never_fit_is_refused_at_once_and_nothing_is_queued():
    async def go():
        fake = cluster(gpu_nodes=1)
        ctl = await controller(fake)
        big = {"num_nodes": 2, "cpus_per_accelerator": 8, "component_placement": {"a": "0-3"}}
        with pytest.raises(ReservationInfeasible, match="can never be placed"):
            await ctl.reserve("w", big, 5, queue="q")
        assert stored(fake, "w") is None
        with pytest.raises(ReservationError, match="queue 'no good'"):
            await ctl.reserve("w", q("0-3"), 5, queue="no good")
        with pytest.raises(ReservationError, match="priority True"):
            await ctl.reserve("w", q("0-3"), 5, queue="q", priority=True)
        await ctl.stop()

    run(go())


def test_a_quota_keeps_a_queue_waiting_while_the_cluster_has_room():
    async def go():
        fake = cluster(gpu_nodes=2)
        ctl = await controller(fake)
        assert await ctl.set_operator("op-token") == sha256("op-token")
        assert await ctl.set_quota("team", {"GPU": 4}, token="op-token") == {"GPU": 4.0}
        assert info(await ctl.reserve("one", q("0-3"), 5, queue="team")).state == "ready"
        two = asyncio.create_task(ctl.reserve("two", q("4-7"), 10, queue="team"))
        await until(lambda: (r := stored(fake, "two")) is not None and r.state == "queued")
        entries = msgspec.msgpack.decode(await ctl.queue(), type=list[QueueEntry])
        await until(lambda: "at its quota" in ctl.ops.admitter.why("two")[1])
        assert entries[0].job == "two"
        await ctl.release("one")
        assert info(await asyncio.wait_for(two, 5)).state == "ready"
        assert await ctl.quotas() == {"team": {"GPU": 4.0}}
        again = await controller(fake)  # the quota is in the table
        assert await again.quotas() == {"team": {"GPU": 4.0}}
        with pytest.raises(ReservationError, match="quota GPU=-1"):
            await again.set_quota("team", {"GPU": -1})
        await ctl.stop()
        await again.stop()

    run(go())


# ------------------------------------------------------------------ preemption
def holding(job, nodes, priority=0, preemptible=True, gpus=4.0, leaving=False):
    return Holding(
        job=job,
        priority=priority,
        preemptible=preemptible,
        needs={n: {"GPU": gpus} for n in nodes},
        leaving=leaving,
    )


def test_preemption_takes_only_what_is_needed_lowest_priority_first():
    want = entry("vip", ["a"], priority=9)
    free = {"a": {"GPU": 0.0}, "b": {"GPU": 0.0}}
    spare = [holding("p1", ["a"], 1, gpus=2), holding("p0", ["a"], 0, gpus=2)]
    assert victims(want, free, spare) == ["p0", "p1"]  # both needed
    half = Entry(job="vip", queue="q", priority=9, needs={"a": {"GPU": 2.0}})
    assert victims(half, free, spare) == ["p0"]  # the lower priority only
    assert victims(want, free, [holding("b-job", ["b"], 0)]) is None  # not on its node
    assert victims(want, free, [holding("p", ["a"], 0, gpus=2)]) is None  # not enough
    assert victims(want, free, [holding("p", ["a"], 9)]) is None  # not lower priority
    assert victims(want, free, [holding("p", ["a"], 0, preemptible=False)]) is None
    assert victims(want, free, [holding("p", ["a"], 0, leaving=True)]) == []  # leaving


def test_a_decision_preempts_for_the_waiting_and_names_what_it_waits_for():
    free = {"a": {"GPU": 0.0}}
    d = decide([entry("vip", ["a"], priority=9)], free, holdings=[holding("low", ["a"], 0)])
    assert d.preempt == {"low": "vip"} and d.admitted == []
    assert d.waiting["vip"][1] == "waits for preempted low to leave"
    d = decide(
        [entry("vip", ["a"], priority=9)],
        free,
        holdings=[holding("low", ["a"], 0, preemptible=False)],
    )
    assert d.preempt == {}


def test_a_preemptible_reservation_is_released_at_its_deadline_for_a_higher_priority():
    async def go():
        fake = cluster(gpu_nodes=1)
        ctl = await controller(fake)
        await ctl.reserve("low", q("0-3", num_nodes=2), 5, priority=0, preemptible=True)
        vip = asyncio.create_task(
            ctl.reserve("vip", q("0-3", num_nodes=2), 10, queue="q", priority=5)
        )
        rec = await until(lambda: (r := stored(fake, "low")) is not None and r.preempt_at and r)
        assert rec.state == "ready" and "preempted for 'vip'" in rec.reason
        assert info(await ctl.status("low")).preempting  # drivers see it
        got = info(await asyncio.wait_for(vip, 5))
        assert got.state == "ready" and stored(fake, "low") is None
        await ctl.stop()

    run(go())


def test_a_health_check_of_a_preempted_reservation_keeps_its_deadlines_reason():
    async def go():
        fake = cluster(gpu_nodes=1)
        ctl = await controller(fake)
        await ctl.reserve("low", q("0-3", num_nodes=2), 5, preemptible=True, preempt_grace_s=60)
        vip = asyncio.create_task(
            ctl.reserve("vip", q("0-3", num_nodes=2), 30, queue="q", priority=5)
        )
        rec = await until(lambda: (r := stored(fake, "low")) is not None and r.preempt_at and r)
        # The periodic check finds every group CREATED: ready, yet still leaving.
        table = await fake.groups(sorted(rec.group_ids()))
        await ctl.ops.checker.check("low", table)
        after = stored(fake, "low")
        assert after.state == "ready" and after.reason == rec.reason
        assert "preempted for 'vip'" in info(await ctl.status("low")).reason
        vip.cancel()
        await ctl.stop()

    run(go())


def test_what_is_not_preemptible_or_of_higher_priority_is_never_taken():
    async def go():
        fake = cluster(gpu_nodes=2)
        ctl = await controller(fake)
        await ctl.reserve("firm", q("0-3"), 5, priority=0)
        await ctl.reserve("high", q("4-7"), 5, priority=9, preemptible=True)
        a = asyncio.create_task(ctl.reserve("a", q("0-3"), 10, queue="q", priority=5))
        b = asyncio.create_task(ctl.reserve("b", q("4-7"), 10, queue="q", priority=5))
        await until(lambda: ctl.ops.admitter.why("a") and ctl.ops.admitter.why("b"))
        await asyncio.sleep(0.5)  # well past the grace: nothing happens
        assert not stored(fake, "firm").preempt_at and not stored(fake, "high").preempt_at
        assert stored(fake, "a").state == stored(fake, "b").state == "queued"
        for t in (a, b):
            t.cancel()
        await asyncio.gather(a, b, return_exceptions=True)
        await ctl.stop()

    run(go())


def test_an_apply_may_not_take_a_queue_past_its_quota():
    async def go():
        fake = cluster(gpu_nodes=2)
        ctl = await controller(fake)
        await ctl.set_quota("team", {"GPU": 4}, force=True)
        await ctl.reserve("one", q("0-3"), 5, queue="team")
        with pytest.raises(ReservationError, match=r"queue 'team' to GPU 8 \(quota 4\)"):
            await ctl.apply("one", q("0-7"), 5)
        assert stored(fake, "one").epoch == 1  # nothing changed
        await ctl.set_quota("team", {"GPU": 8}, force=True)
        await ctl.apply("one", q("0-7"), 5)
        assert stored(fake, "one").epoch == 2
        await ctl.stop()

    run(go())


def test_one_waiting_behind_another_still_holds_its_other_nodes():
    # z needs a (busy) and b; y needs b and c; x needs only c. y waits behind z on b, and
    # holds c meanwhile: x may not take c, or y could be passed there for ever.
    free = {"a": {"GPU": 0.0}, "b": GPU4, "c": GPU4}
    entries = [entry("z", ["a", "b"], 5), entry("y", ["b", "c"], 4), entry("x", ["c"], 3)]
    d = decide(entries, free)
    assert d.admitted == []
    assert "waits behind y" in d.waiting["x"][1]


RACK = {"placectl.io/rack": "r0"}  # one rack: its nodes rank before the head


@pytest.mark.parametrize("first_to_choose", ["repair", "admission"])
def test_a_queued_reservation_and_a_repair_never_take_one_free_node_both(first_to_choose):
    """A reservation on the first node and one queued for that node; the second node
    free. The first node dies: the first job repairs onto the free node, and the queued
    one, planned again over the nodes left, fits there too; both read Ray's free
    resources before either's group exists (a creation takes half a second here).
    Whichever chooses first claims the node and the other sees the claim: never both
    pinned to it, one of them waiting for ever behind the other's group."""

    async def go():
        fake = FakeCluster()
        fake.add_node(num_gpus=0, num_cpus=2, head=True)
        first, free = (fake.add_node(num_gpus=4, num_cpus=16, labels=RACK) for _ in range(2))
        ctl = await controller(fake)
        await ctl.reserve("job", q("0-3", num_nodes=1), 5)
        waiting = asyncio.create_task(ctl.reserve("next", q("0-3", num_nodes=1), 30, queue="q"))
        await until(lambda: (r := stored(fake, "next")) is not None and r.state == "queued")
        assert {s.node_id for s in stored(fake, "job").slots} == {first}
        fake.create_delay = 0.5
        fake.kill_node(first)
        # An admission pass (the loop's own comes at a node's death, or every few
        # seconds) once the repair has chosen the free node and its group is being
        # made; or as soon as the node is out of the view, before the repair chooses.
        claims = ctl.ops.ctx.claims
        if first_to_choose == "repair":
            await until(lambda: "repair/job" in claims.claimed())
        else:  # Ray's node table read at once, before the loop hears of the death
            await ctl.ops.ctx.nodes.refresh()
            assert "repair/job" not in claims.claimed()
        await ctl.ops.admitter.admit()
        await asyncio.sleep(3.0)  # both settled: placed, or waiting for a node
        job, nxt = stored(fake, "job"), stored(fake, "next")
        on = {"job": {s.node_id for s in job.slots}, "next": {s.node_id for s in nxt.slots}}
        assert not (free in on["job"] and free in on["next"]), (job.state, nxt.state, on)
        assert (job.state, nxt.state) in (("ready", "queued"), ("degraded", "ready")), (
            job.state, nxt.state, on,
        )  # fmt: skip
        waiting.cancel()
        await ctl.stop()

    run(go())


def test_a_queued_floating_reservation_is_placed_on_the_nodes_admission_claimed_for_it():
    """A reservation whose nodes float (any node matching a selector) waits in the
    queue while the only free matching node is taken, and is admitted when it frees:
    admission claims that node for it until it is placed, and its own placement, which
    chooses the floating nodes again, counts that claim as its own, not another's."""

    async def go():
        fake = FakeCluster()
        fake.add_node(num_gpus=0, num_cpus=2, head=True)
        for _ in range(2):
            fake.add_node(num_gpus=4, num_cpus=16, labels={**RACK, "pool": "x"})
        floating = {
            "num_nodes": 1,
            "node_groups": [{"label": "any", "selector": {"pool": "x"}, "count": 1}],
            "component_placement": {"actor": {"node_group": "any", "placement": "0-3"}},
        }
        ctl = await controller(fake)
        await ctl.reserve("a", floating, 5, queue="q")
        await ctl.reserve("b", floating, 5, queue="q")
        waiting = asyncio.create_task(ctl.reserve("c", floating, 30, queue="q"))
        await until(lambda: (r := stored(fake, "c")) is not None and r.state == "queued")
        fake.create_delay = 0.5  # the admitted reservation's group takes a moment
        # Whichever of the two frees, the one the ties of an empty choice never fall on.
        order = sorted(("a", "b"), key=lambda j: min(stored(fake, j).nodes))
        freed = {s.node_id for s in stored(fake, order[-1]).slots}
        await ctl.release(order[-1])
        got = info(await asyncio.wait_for(waiting, 10))
        assert got.state == "ready"
        assert {s.node_id for s in stored(fake, "c").slots} == freed
        assert ctl.ops.ctx.claims.claimed() == {}  # let go once placed
        await ctl.stop()

    run(go())
