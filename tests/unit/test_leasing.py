"""Port leases on the fake cluster: concurrency, retries, unresponsive nodes, repairs."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from controller.errors import ReservationError
from controller.runtime.core.settings import FAST
from tests.unit.fakes import cluster, controller, run, spec, stored, until


def test_concurrent_calls_with_one_name_make_one_lease():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-3"), 5)
        got = await asyncio.gather(
            *(ctl.lease_ports("j", "actor", 1, 4, True, "kv", None) for _ in range(8))
        )
        assert len({tuple(g) for g in got}) == 1
        assert [x.purpose for x in stored(fake, "j").leases].count("name:kv") == 1
        await ctl.stop()

    run(go())


def test_concurrent_leases_across_jobs_on_one_node_never_share_a_port():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("a", spec("0-1"), 5)
        await ctl.reserve("b", spec("2-3"), 5)  # the same node
        calls = [
            ctl.lease_ports(job, "actor", 0, 3, True, None, f"{job}{i}")
            for i in range(6)
            for job in ("a", "b")
        ]
        got = await asyncio.gather(*calls)
        flat = [p for ports in got for p in ports]
        masters = [
            x.ports[0] for j in "ab" for x in stored(fake, j).leases if x.purpose == "master"
        ]
        assert len(flat) == len(set(flat)) == 36 and not set(flat) & set(masters)
        assert all(ports == list(range(ports[0], ports[0] + 3)) for ports in got)
        await ctl.stop()

    run(go())


def test_a_retried_request_finds_the_lease_it_made():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-3"), 5)
        first = await ctl.lease_ports("j", "actor", 0, 2, True, None, "req-1")
        await ctl.stop()
        ctl2 = await controller(fake)  # Ray retries the call against the new incarnation
        assert await ctl2.lease_ports("j", "actor", 0, 2, True, None, "req-1") == first
        assert len(stored(fake, "j").leases) == 2  # master + this one
        await ctl2.stop()

    run(go())


def test_an_unresponsive_node_stalls_only_its_own_leases():
    async def go():
        fake = cluster()
        ctl = await controller(fake, msgspec.structs.replace(FAST, port_check_timeout=2.0))
        await ctl.reserve("a", spec("0-3"), 5)
        await ctl.reserve("b", spec("4-7"), 5)
        node_a = stored(fake, "a").slots[0].node_id
        fake.nodes_by_id[node_a].answers = False
        stuck = asyncio.ensure_future(ctl.lease_ports("a", "actor", 0, 1, True, None, "x"))
        await asyncio.sleep(0.01)
        assert await ctl.lease_ports("b", "actor", 0, 1, True, None, "y")
        assert not stuck.done()  # the other node's lease did not wait for this one
        with pytest.raises(ReservationError, match="did not answer the port check"):
            await stuck
        assert [x.purpose for x in stored(fake, "a").leases] == ["master"]
        await ctl.stop()

    run(go())


def test_ephemeral_range_and_bound_ports_are_skipped():
    async def go():
        fake = cluster()
        for node in fake.nodes_by_id.values():
            node.ephemeral = (20000, 24999)
            node.bound_ports = set(range(25000, 25010))
        ctl = await controller(fake)
        conf = {**spec("0-3"), "ports": {"low": 20000, "high": 25020}}
        await ctl.reserve("j", conf, 5)
        ports = await ctl.lease_ports("j", "actor", 0, 5, True, None, "r")
        masters = [x.ports[0] for x in stored(fake, "j").leases if x.purpose == "master"]
        assert all(25010 <= p <= 25020 for p in ports + masters)
        with pytest.raises(ReservationError, match="no 20 consecutive free port"):
            await ctl.lease_ports("j", "actor", 0, 20, True, None, "r2")
        await ctl.stop()

    run(go())


def test_a_lease_made_while_a_repair_runs_is_kept():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-7"), 5)  # two nodes; the spare is the third
        survivor = stored(fake, "j").slots[1]
        fake.kill_node(stored(fake, "j").slots[0].node_id)
        await until(lambda: (r := stored(fake, "j")).state == "degraded" or r.epoch == 2)
        lease = await ctl.lease_ports("j", "actor", 4, 1, True, "kept", None)
        rec = await until(lambda: (r := stored(fake, "j")).epoch == 2 and r.state == "ready" and r)
        named = [x for x in rec.leases if x.purpose == "name:kept"]
        assert [x.ports for x in named] == [lease] and named[0].node_id == survivor.node_id
        await ctl.stop()

    run(go())


def test_masters_move_with_rank_zero_and_stay_unique():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-7", rollout="4-7"), 5)
        before = {x.component: x for x in stored(fake, "j").leases}
        fake.kill_node(before["actor"].node_id)
        rec = await until(lambda: (r := stored(fake, "j")).epoch == 2 and r.state == "ready" and r)
        after = {x.component: x for x in rec.leases}
        assert after["actor"].node_id != before["actor"].node_id
        assert after["rollout"] == before["rollout"]  # its rank 0 did not move
        await ctl.stop()

    run(go())
