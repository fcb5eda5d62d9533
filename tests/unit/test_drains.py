"""Nodes Ray is draining (a spot notice, a pod deleted): their slots move to spares
before the nodes go, make before break, on the fake cluster; and the loop's one pass
that finds what each reservation asks for (a move among the rest)."""

from __future__ import annotations

import asyncio

import msgspec

from controller.runtime import core
from controller.runtime.core.settings import FAST
from controller.runtime.edge import CREATED, REMOVED
from tests.unit.fakes import cluster, controller, info, published, run, spec, stored, until
from tests.unit.test_records import make
from tests.unit.test_writers import watch


def test_a_draining_nodes_slot_moves_to_a_spare_and_its_old_group_waits_for_the_deadline():
    async def go():
        fake = cluster(gpu_nodes=3)  # two hold the job, one is spare
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-7", num_nodes=3))
        before = stored(fake, "j")
        node, old = before.slots[0].node_id, before.slots[0].group_id
        written = watch(fake, "j")
        # A spot notice: the node goes in 5 s (the move takes milliseconds; the margin is
        # for a loaded machine, where a 1.5 s deadline was seen to pass first).
        fake.draining[node] = core.wall() + 5
        moved = await until(lambda: (r := stored(fake, "j")).epoch == 2 and r)
        assert node not in moved.node_ids() and moved.state == "ready"
        assert [x.group_id for x in moved.leaving] == [old]
        status = info(await ctl.status("j"))  # what drivers see: where, and until when
        assert status.state == "ready" and status.leaving == {node: fake.draining[node]}
        on = {a.placement.node_id for a in published(fake, "j").components["actor"]}
        assert on == moved.node_ids() and node not in on
        await ctl.reconciler.tick(full=True)  # an orphan sweep leaves the old group be
        await asyncio.sleep(0.05)
        assert fake.groups_by_id[old].state == CREATED  # its workers finish their step
        await until(lambda: not stored(fake, "j").leaving, timeout=20)
        assert fake.groups_by_id[old].state == REMOVED
        assert core.wall() >= fake.draining[node]  # not before the deadline
        assert {r.state for r in written} == {"ready"}  # never degraded on the way
        await ctl.stop()

    run(go())


def test_without_a_spare_the_slot_stays_and_says_why_until_one_joins():
    async def go():
        fake = cluster(gpu_nodes=2)
        # drain_grace long enough that the check below, on a loaded machine, still
        # finds the old group waiting out its grace.
        ctl = await controller(fake, msgspec.structs.replace(FAST, drain_grace=30.0))
        await ctl.reserve("j", spec("0-7", num_nodes=3))
        node = stored(fake, "j").slots[1].node_id
        fake.draining[node] = 0.0  # no deadline given
        record = await until(lambda: "draining node" in (r := stored(fake, "j")).reason and r)
        assert record.epoch == 1 and record.state == "ready" and "no spare" in record.reason
        fake.add_node(num_gpus=4, num_cpus=4)
        moved = await until(lambda: (r := stored(fake, "j")).epoch == 2 and r, timeout=5)
        assert node not in moved.node_ids() and moved.reason == ""
        (leaving,) = moved.leaving  # no deadline: kept for drain_grace after the move
        assert 0 < leaving.remove_at - core.wall() <= ctl.settings.drain_grace
        await ctl.stop()

    run(go())


def test_a_release_removes_the_groups_still_leaving():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-7", num_nodes=3))
        old = stored(fake, "j").slots[0]
        fake.draining[old.node_id] = core.wall() + 60
        await until(lambda: stored(fake, "j").epoch == 2)
        assert await ctl.release("j")
        assert fake.groups_by_id[old.group_id].state == REMOVED
        await ctl.stop()

    run(go())


def test_one_pass_finds_what_each_reservation_asks_for_in_order():
    """The loop's detector (``reconcile.findings``), a pure function of the record and
    the node view: what each state asks for, old slots on a drained node besides."""
    from controller.runtime.steps.reconcile import Finding, findings
    from controller.state.records import Applying, LeavingGroup

    _, res = make()  # a ready record, as the controller keeps it
    nodes = set(res.node_ids()) | {"elsewhere"}
    node = sorted(res.node_ids())[0]
    swap = msgspec.structs.replace

    def found(r, draining=(), alive=nodes, now=100.0, spares_due=False):
        return findings(r, set(draining), alive, now, spares_due)

    assert found(res) == []  # ready, nothing draining: nothing to do
    assert found(res, draining=["elsewhere"]) == []
    assert found(res, draining=[node]) == [Finding.ON_DRAINING]
    assert found(swap(res, repair="manual"), draining=[node]) == []  # the operator's call
    assert found(swap(res, state="degraded")) == [Finding.BROKEN]
    assert found(swap(res, state="degraded", repair="manual")) == []
    assert found(res, spares_due=True) == [Finding.SPARES_DUE]
    assert found(swap(res, state="releasing")) == [Finding.CUT_SHORT]
    assert found(swap(res, state="pending")) == [Finding.CUT_SHORT]
    stuck = swap(res, state="degraded", applying=Applying(epoch=4, group_names=["p:x"]))
    assert found(stuck) == [Finding.INTENT_LEFT]  # cleared first: the repair comes after
    old = LeavingGroup(group_id="g9", node_id="gone", remove_at=500.0)
    left = swap(res, leaving=[old])
    assert found(left) == [Finding.LEAVING_DUE]  # its node is gone
    kept = swap(res, leaving=[swap(old, node_id="elsewhere")])
    assert found(kept) == [] and found(kept, now=500.0) == [Finding.LEAVING_DUE]
    # Old slots due go with one of the others; a broken slot comes before a drain.
    assert found(swap(left, state="degraded"), draining=[node]) == [
        Finding.LEAVING_DUE,
        Finding.BROKEN,
    ]
