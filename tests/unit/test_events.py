"""The event history, the operator's token and each queue's use, on the fake cluster.

What happened is checked against what the fake cluster did (a node killed, a group
removed, a queue that waited), never against the function that names the events.
"""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from controller.errors import NotOwner, ReservationError
from controller.runtime.core.settings import FAST
from controller.state.events import Event
from controller.state.queueing import QueueUsage
from controller.state.table import EVENT, event_key
from tests.unit.fakes import cluster, controller, run, sha256, spec, stored, until

A = "token-of-a"


def events(data: bytes) -> list[Event]:
    return msgspec.msgpack.decode(data, type=list[Event])


async def kinds(ctl, job=None) -> list[str]:
    return [e.kind for e in events(await ctl.events(job))]


def test_a_reservation_s_life_is_told_in_order_with_who_acted_and_why():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-7", num_nodes=3), 5, token=A)
        node = stored(fake, "j").slots[0].node_id
        fake.kill_node(node)  # the control loop finds it and repairs on the spare
        await until(lambda: (r := stored(fake, "j")) and r.state == "ready" and r.epoch == 2)
        await until(lambda: len(fake.metrics.events) >= 3)
        await ctl.release("j", token=A)
        told = events(await ctl.events("j"))
        assert [e.kind for e in told] == [
            "reserved",
            "degraded",
            "repaired",
            "releasing",
            "released",
        ]
        reserved, degraded, repaired, *_ = told
        mine = f"client {sha256(A)}"
        assert reserved.by == mine and told[-1].by == mine  # the client reserved, released
        assert degraded.by == repaired.by == "controller"  # the loop noticed and repaired
        assert node[:12] in degraded.message and degraded.cause == repaired.cause == "node-lost"
        assert repaired.epoch == 2 and repaired.seconds > 0
        assert [e.seq for e in told] == sorted(e.seq for e in told)
        # What the metrics were told is the same history.
        assert [e.kind for e in fake.metrics.events] == [e.kind for e in told]
        await ctl.stop()

    run(go())


def test_a_group_removed_behind_the_controller_s_back_is_told_as_such():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-3", num_nodes=2), 5)
        fake.remove_group_behind_back(stored(fake, "j").slots[0].group_id)
        await until(lambda: stored(fake, "j").epoch == 2)
        await until(lambda: "repaired" in [e.kind for e in fake.metrics.events])
        told = {e.kind: e for e in events(await ctl.events("j"))}
        assert told["degraded"].cause == told["repaired"].cause == "group-removed"
        assert told["reserved"].by == "client (no token)"
        await ctl.stop()

    run(go())


def test_the_cause_is_kept_while_the_reason_changes_during_a_long_repair():
    """A lost node without a spare: the repair rewrites the reason ("no spare node") for
    as long as it waits; the cause stays the node loss, and the repair is told as one
    (it was read back out of the last reason, and came out "other")."""

    async def go():
        fake = cluster(gpu_nodes=2)  # both GPU nodes held: no spare
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-7", num_nodes=3), 5)
        fake.kill_node(stored(fake, "j").slots[0].node_id)
        waiting = await until(lambda: "spare" in (r := stored(fake, "j")).reason and r)
        assert waiting.state == "degraded" and waiting.cause == "node-lost"
        assert " is dead" not in waiting.reason  # the words no longer name the cause
        fake.add_node(num_gpus=4, num_cpus=4)
        back = await until(lambda: (r := stored(fake, "j")).state == "ready" and r, timeout=10)
        assert back.cause == ""
        await until(lambda: "repaired" in [e.kind for e in fake.metrics.events])
        told = {e.kind: e for e in events(await ctl.events("j"))}
        assert told["degraded"].cause == told["repaired"].cause == "node-lost"
        await ctl.stop()

    run(go())


def test_queued_admitted_preempted_and_applied_are_told():
    async def go():
        fake = cluster(gpu_nodes=1)
        ctl = await controller(fake)
        await ctl.reserve("low", spec("0-3", num_nodes=2), 5, preemptible=True)
        await ctl.apply("low", spec("0-1", num_nodes=2), 5)
        vip = asyncio.create_task(
            ctl.reserve("vip", spec("0-3", num_nodes=2), 10, queue="q", priority=5)
        )
        await asyncio.wait_for(vip, 5)
        assert await kinds(ctl, "low") == [
            "reserved",
            "applied",
            "preempted",
            "releasing",
            "released",
        ]
        vip_told = events(await ctl.events("vip"))
        assert [e.kind for e in vip_told] == ["queued", "admitted", "reserved"]
        assert vip_told[1].queue == "q" and vip_told[1].seconds > 0
        assert "preempted for 'vip'" in events(await ctl.events("low"))[2].message
        await ctl.stop()

    run(go())


def test_a_change_that_is_not_written_is_not_told():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        fake.fail_kv_writes = 1  # the reservation's intent cannot be written
        with pytest.raises(Exception, match="GCS"):
            await ctl.reserve("j", spec(), 5)
        await ctl.reserve("k", spec(), 5)
        assert await kinds(ctl) == ["reserved"] and events(await ctl.events())[0].job == "k"
        await ctl.stop()

    run(go())


def test_the_history_is_kept_with_the_table_bounded_and_numbered_on():
    async def go():
        fake = cluster()
        settings = msgspec.structs.replace(FAST, events_kept=4)
        ctl = await controller(fake, settings)
        for i in range(3):
            await ctl.reserve(f"j{i}", spec("0-0", num_nodes=2), 5)
            await ctl.release(f"j{i}")
        newest = [event_key(seq) for seq in (6, 7, 8, 9)]  # 9 events: the newest 4 stay
        await until(lambda: sorted(k for k in fake.kv if k.startswith(EVENT)) == newest)
        await ctl.stop()
        again = await controller(fake, settings)  # a restarted controller tells the same
        told = events(await again.events())
        assert [e.seq for e in told] == [6, 7, 8, 9]
        assert [(e.job, e.kind) for e in told][-1] == ("j2", "released")
        await again.reserve("next", spec("0-0", num_nodes=2), 5)
        assert events(await again.events("next"))[0].seq == 10
        newest = events(await again.events(after=8))
        assert [e.seq for e in newest] == [9, 10]
        await again.stop()

    run(go())


def test_bad_queries_of_the_history_are_refused_in_one_line():
    async def go():
        ctl = await controller(cluster())
        for bad, match in (
            ({"job": "no spaces"}, "job name"),
            ({"after": -1}, "after -1"),
            ({"limit": 0}, r"limit 0: expected an int in \[1, 10000\]"),
        ):
            with pytest.raises(ReservationError, match=match):
                await ctl.events(**bad)
        await ctl.stop()

    run(go())


def test_quota_changes_need_the_operator_s_token_or_force_and_are_told():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        with pytest.raises(NotOwner, match="none is set"):
            await ctl.set_quota("team", {"GPU": 4})
        await ctl.set_quota("team", {"GPU": 4}, force=True)
        await ctl.set_operator("op")
        with pytest.raises(NotOwner, match="operator's token"):
            await ctl.set_quota("team", {"GPU": 8}, token="someone-else")
        await ctl.set_quota("team", {"GPU": 8}, token="op")
        with pytest.raises(NotOwner, match="another one is set"):
            await ctl.set_operator("intruder")
        assert await ctl.quotas() == {"team": {"GPU": 8.0}}
        await ctl.stop()
        again = await controller(fake)  # the operator's token hash is in the table
        with pytest.raises(NotOwner):
            await again.set_quota("team", {"GPU": 1})
        told = events(await again.events())
        assert [(e.kind, e.by) for e in told] == [
            ("quota", "client (no token) (forced)"),
            ("operator", f"client {sha256('op')}"),
            ("quota", f"client {sha256('op')}"),
        ]
        assert told[2].message == "quota of 'team' set: GPU=8" and told[2].queue == "team"
        await again.stop()

    run(go())


def test_each_queue_s_use_is_shown_beside_its_quota_and_reported():
    async def go():
        fake = cluster(gpu_nodes=2)
        ctl = await controller(fake)
        await ctl.set_quota("team", {"GPU": 4}, force=True)
        await ctl.reserve("one", spec("0-3", num_nodes=2), 5, queue="team")
        await ctl.reserve("free", spec("4-5", num_nodes=3), 5)
        two = asyncio.create_task(ctl.reserve("two", spec("0-1", num_nodes=2), 10, queue="team"))
        await until(lambda: (r := stored(fake, "two")) is not None and r.state == "queued")
        use = {
            u.queue: u for u in msgspec.msgpack.decode(await ctl.queues(), type=list[QueueUsage])
        }
        team = use["team"]
        assert team.limits == {"GPU": 4.0} and team.used["GPU"] == 4.0
        assert (team.placed, team.accelerators, team.queued) == (1, 4, 1)
        assert use[""].accelerators == 2 and use[""].limits == {}  # no quota binds them
        await until(lambda: use["team"].oldest_wait_s < team_wait(fake))
        two.cancel()
        await asyncio.gather(two, return_exceptions=True)
        await ctl.stop()

    def team_wait(fake):
        reported = {u.queue: u for u in fake.metrics.usage}
        return reported.get("team") is not None and reported["team"].oldest_wait_s

    run(go())


def test_one_table_answers_every_cause_and_a_removed_group_is_made_again_on_its_node():
    from controller.state.causes import CAUSES, OWN_NODE, RESPONSES, SPARE, Cause

    assert set(RESPONSES) == set(CAUSES)
    assert {r.replace_on for r in RESPONSES.values()} <= {OWN_NODE, SPARE}
    # a cause read back from the table is its member; one a newer placectl wrote is OTHER
    assert Cause.of("node-lost") is Cause.NODE_LOST and RESPONSES[Cause.of("node-lost")]
    assert Cause.of("gpu-xid-79") is Cause.OTHER

    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-1"), 5)
        before = stored(fake, "j").slots[0]
        fake.remove_group_behind_back(before.group_id)  # the node lives
        rec = await until(lambda: (r := stored(fake, "j")).epoch == 2 and r.state == "ready" and r)
        assert (
            rec.slots[0].node_id == before.node_id != ""
            and rec.slots[0].group_id != before.group_id
        )
        assert [e.cause for e in events(await ctl.events("j")) if e.kind == "repaired"] == [
            "group-removed"
        ]
        await ctl.stop()

    run(go())
