"""Nodes an operator takes out of placement (``cordon``, ``drain``, ``uncordon``), on the
fake cluster: a cordoned node gets no new slot and keeps its own; a drained one's slots
move off it make before break; cordons outlive the controller; a bad name or a missing
token gets one line and changes nothing."""

from __future__ import annotations

import msgspec
import pytest

from controller.errors import NotOwner, ReservationError
from controller.runtime.core.settings import FAST
from controller.runtime.edge import CREATED, REMOVED
from tests.unit.fakes import cluster, controller, run, spec, stored, until
from tests.unit.test_writers import watch

ONE_NODE = "0-3"  # 4 GPUs: one node's worth


def test_a_cordoned_node_gets_no_new_slot_and_keeps_the_ones_it_holds():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake)
        # GPUs 0-3 are the first usable node's: where a new slot of "0-3" goes.
        await ctl.reserve("held", spec(ONE_NODE))
        held = stored(fake, "held").node_ids()
        (node,) = held
        got = await ctl.cordon(node=node, why="Xid 79 on GPU 2", force=True)
        assert got["node"] == node and got["moving"] == [] and not got["drain"]
        assert stored(fake, "held").node_ids() == held and stored(fake, "held").epoch == 1
        await ctl.release("held")
        await ctl.reserve("probe", spec(ONE_NODE))
        assert node not in stored(fake, "probe").node_ids()
        listed = await ctl.cordons()
        assert [c["node"] for c in listed] == [node] and listed[0]["why"] == "Xid 79 on GPU 2"
        health = await ctl.health()
        assert "Xid 79" in health["cordoned"][node]
        await ctl.release("probe")
        await ctl.uncordon(node=node, force=True)
        await ctl.reserve("probe", spec(ONE_NODE))
        assert stored(fake, "probe").node_ids() == held  # given back
        told = [e.message for e in ctl.state.history.since(0, "", 100) if e.kind == "cordon"]
        assert len(told) == 2 and "cordoned: Xid 79" in told[0] and "uncordoned" in told[1]
        await ctl.stop()

    run(go())


def test_a_drained_nodes_slots_move_off_it_make_before_break():
    async def go():
        fake = cluster(gpu_nodes=3)  # two hold the job, one is spare
        settings = msgspec.structs.replace(FAST, drain_grace=0.5)
        ctl = await controller(fake, settings)
        await ctl.reserve("j", spec("0-7", num_nodes=3))
        before = stored(fake, "j")
        node, old = before.slots[0].node_id, before.slots[0].group_id
        written = watch(fake, "j")
        ip = fake.nodes_by_id[node].info.ip
        got = await ctl.cordon(node=ip, drain=True, why="maintenance", force=True)
        assert got["node"] == node and got["moving"] == ["j"]
        moved = await until(lambda: (r := stored(fake, "j")).epoch == 2 and r)
        assert node not in moved.node_ids() and moved.state == "ready"
        assert fake.groups_by_id[old].state == CREATED  # the old slot waits: ranks move
        await until(lambda: not stored(fake, "j").leaving, timeout=10)
        assert fake.groups_by_id[old].state == REMOVED
        assert {r.state for r in written} == {"ready"}  # never degraded on the way
        assert fake.nodes_by_id[node].info.alive  # the node stays in the cluster
        await ctl.stop()

    run(go())


def test_cordons_outlive_the_controller():
    async def go():
        fake = cluster(gpu_nodes=2)
        ctl = await controller(fake)
        await ctl.reserve("probe", spec(ONE_NODE, num_nodes=2))
        (node,) = stored(fake, "probe").node_ids()
        await ctl.release("probe")
        await ctl.cordon(node=node, force=True)
        await ctl.stop()
        again = await controller(fake)  # a new incarnation reads the table
        assert [c["node"] for c in await again.cordons()] == [node]
        await again.reserve("probe", spec(ONE_NODE, num_nodes=2))
        assert node not in stored(fake, "probe").node_ids()
        await again.stop()

    run(go())


def test_a_bad_name_or_a_missing_token_gets_one_line_and_changes_nothing():
    async def go():
        fake = cluster(gpu_nodes=2)
        ctl = await controller(fake)
        await ctl.set_operator("op")
        node = sorted(fake.nodes_by_id)[-1]
        for name, words in [
            ("no-such-node", "no alive node has that id or address"),
            (node[:8], "the prefix of 3 node ids; give more of it"),  # the fake's ids
            ("", "expected a node id"),
            (7, "expected a node id"),
        ]:
            with pytest.raises(ReservationError, match=words) as e:
                await ctl.cordon(node=name, force=True)
            assert "\n" not in str(e.value)
        with pytest.raises(NotOwner, match=r"cordoning node .* refused: it needs the operator"):
            await ctl.cordon(node=node, token="intruder")
        with pytest.raises(ReservationError, match="no node is cordoned"):
            await ctl.uncordon(node=node, force=True)
        assert await ctl.cordons() == []
        got = await ctl.cordon(node=node, drain=True, token="op")  # the operator's: allowed
        assert got["drain"]
        with pytest.raises(ReservationError, match="no cordoned node has that id or address"):
            await ctl.uncordon(node="no-such-node", token="op")
        await ctl.reserve("j", spec(ONE_NODE, num_nodes=2))  # the controller still works
        assert node not in stored(fake, "j").node_ids()
        await ctl.stop()

    run(go())


def test_a_fenced_node_is_dead_in_ray_and_its_slots_are_replaced_at_once():
    async def go():
        fake = cluster(gpu_nodes=3)  # two hold the job, one is spare
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-7", num_nodes=3))
        before = stored(fake, "j")
        node = before.slots[0].node_id
        got = await ctl.cordon(node=node, fence=True, why="Xid 79 on GPU 2", force=True)
        assert got["node"] == node and got["moving"] == ["j"] and got["fence"]
        assert "Xid 79 on GPU 2" in fake.fenced[node]  # told to Ray's GCS, with the reason
        assert not fake.nodes_by_id[node].info.alive  # Ray's verdict now: dead
        repaired = await until(lambda: (r := stored(fake, "j")).epoch == 2 and r)
        assert node not in repaired.node_ids() and repaired.state == "ready"
        assert repaired.node_ids() - {node} >= before.node_ids() - {node}  # the others stay
        told = [e.message for e in ctl.state.history.since(0, "", 100) if e.kind == "fenced"]
        assert len(told) == 1 and "Xid 79" in told[0]
        listed = await ctl.cordons()  # the node stays out: a raylet back there takes no slot
        assert [c["node"] for c in listed] == [node] and listed[0][
            "why"
        ] == "fenced: Xid 79 on GPU 2"
        await ctl.stop()

    run(go())


def test_a_fence_of_the_controllers_node_or_with_a_drain_is_refused():
    async def go():
        fake = cluster(gpu_nodes=2)
        ctl = await controller(fake)
        head = fake.own_node()
        with pytest.raises(ReservationError, match="runs this controller") as e:
            await ctl.cordon(node=head, fence=True, force=True)
        assert "\n" not in str(e.value)
        node = sorted(n for n in fake.nodes_by_id if n != head)[0]
        with pytest.raises(ReservationError, match="fence or drain, not both"):
            await ctl.cordon(node=node, fence=True, drain=True, force=True)
        with pytest.raises(NotOwner, match=r"fencing node .* refused"):
            await ctl.cordon(node=node, fence=True, token="intruder")
        assert fake.fenced == {} and await ctl.cordons() == []
        assert all(n.info.alive for n in fake.nodes_by_id.values())
        await ctl.stop()

    run(go())
