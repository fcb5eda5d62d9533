"""Core leases on the fake cluster: disjoint on a node across jobs, sized by the rank's
bundles, idempotent, recorded, gone with the slot; and the mapping of units to cores."""

from __future__ import annotations

import asyncio

import pytest

from controller.errors import PlacementError, ReservationError
from controller.state.leases import cores_of, pick_units
from tests.unit.fakes import cluster, controller, run, spec, stored, until


def test_leases_of_two_jobs_on_one_node_never_share_a_unit():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("a", spec("0-1"), 5)
        await ctl.reserve("b", spec("2-3"), 5)  # the same node
        calls = [
            ctl.lease_cores(job, "actor", rank, f"cores@{job}{rank}")
            for rank in (0, 1)
            for job in ("a", "b")
        ]
        got = await asyncio.gather(*calls)
        units = [u for g in got for u in range(g["first"], g["first"] + g["count"])]
        assert len(units) == len(set(units)) == 4  # one CPU per accelerator bundle: 1 each
        assert {g["node_cpus"] for g in got} == {4} and {g["count"] for g in got} == {1}
        # the same name again: the same lease, also as the GCS holds it
        again = await ctl.lease_cores("a", "actor", 1, "cores@a1")
        assert again == got[2] and len(stored(fake, "a").cores) == 2
        # the node's four units are leased: one more run is refused, in one line
        with pytest.raises(ReservationError, match=r"no 1 free CPU unit\(s\) in a run on node"):
            await ctl.lease_cores("a", "actor", 0, "another")
        await ctl.stop()

    run(go())


def test_a_lease_is_sized_by_the_ranks_bundles_and_checked():
    async def go():
        fake = cluster(gpus=4)
        ctl = await controller(fake)
        wide = {"num_nodes": 3, "cpus_per_accelerator": 2, "component_placement": {"actor": "0-1"}}
        await ctl.reserve("w", wide, 5)
        lease = await ctl.lease_cores("w", "actor", 1, "c")
        assert lease["count"] == 2
        with pytest.raises(PlacementError, match=r"rank 2 of 'actor': out of range \(0-1\)"):
            await ctl.lease_cores("w", "actor", 2, "c")
        with pytest.raises(PlacementError, match="unknown component 'critic'"):
            await ctl.lease_cores("w", "critic", 0, "c")
        await ctl.stop()

    run(go())


def test_a_repair_ends_the_leases_on_the_lost_node():
    async def go():
        fake = cluster(gpu_nodes=4)
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-3"), 5)
        lost = stored(fake, "j").slots[0].node_id
        await ctl.lease_cores("j", "actor", 0, "c")
        assert [x.node_id for x in stored(fake, "j").cores] == [lost]
        fake.kill_node(lost)

        async def repaired() -> bool:
            res = stored(fake, "j")
            return res.epoch > 1 and res.state == "ready"

        await until(repaired)
        assert stored(fake, "j").cores == []
        fresh = await ctl.lease_cores("j", "actor", 0, "c")
        assert fresh["node_id"] != lost
        await ctl.stop()

    run(go())


def test_units_map_to_cores():
    assert pick_units({0, 1, 3}, 8, 2) == 4
    assert pick_units(set(), 2, 3) is None
    assert cores_of(2, 2, 4, [10, 11, 12, 13]) == [12, 13]  # unit u is the u-th core
    # fewer cores than units: spread evenly, so halves of the node stay apart
    assert (cores_of(0, 4, 8, [0, 1]), cores_of(4, 4, 8, [0, 1])) == ([0], [1])
    assert cores_of(0, 8, 8, [0, 1]) == [0, 1]
    with pytest.raises(PlacementError, match=r"CPU units 3-4 of a node of 4: out of range"):
        cores_of(3, 2, 4, [0, 1, 2, 3])
    with pytest.raises(PlacementError, match="its CPU affinity is empty"):
        cores_of(0, 1, 4, [])


def test_an_apply_keeps_the_leases_of_ranks_that_stay_and_ends_the_others():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-3"), 5)
        node = stored(fake, "j").slots[0].node_id
        for rank in (0, 3):
            await ctl.lease_cores("j", "actor", rank, f"cores@{node}")
        # rank 0 stays on its node; rank 3 moves to the next node while this one stays
        await ctl.apply("j", spec("1-4"), 5)
        assert [(x.rank, x.node_id) for x in stored(fake, "j").cores] == [(0, node)]
        await ctl.apply("j", spec("4-5"), 5)  # both ranks move to the next node
        assert stored(fake, "j").cores == []
        moved = await ctl.lease_cores("j", "actor", 0, "cores@there")
        assert moved["node_id"] != node
        await ctl.stop()

    run(go())
