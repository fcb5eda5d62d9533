"""Blips cost nothing, deaths cost seconds: every network shape on the fake cluster, with
the rule's edges (controller.runtime.steps.liveness). A silence witnessed from elsewhere
makes a suspect whose slots move at once; the node is kept, and comes back as free
capacity if it answers before its grace ends; only proof (a refusal heard on a second
path) or the grace fences it. Ray never gives up on a node here, so every verdict is
placectl's; the clock is virtual, so a grace of a minute passes at once."""

from __future__ import annotations

import asyncio

import msgspec

from controller.runtime.core import doubts, evidence
from controller.runtime.core.settings import FAST
from tests.unit.fakes import cluster, controller, run, spec, stored, until

# A blip of 5 s against a grace of a minute (Ray's own detection of a silent node is
# 62 s with its defaults); suspect_after long against the sweeps (5 ms).
RULE = msgspec.structs.replace(FAST, suspect_after=0.3, fence_grace=60.0)


def _kinds(fake) -> list[str]:
    return [e.kind for e in fake.metrics.events]


def _nodes(ctl):
    return ctl.ops.ctx.nodes


async def _back_in_placement(ctl, node: str) -> None:
    await until(lambda: _nodes(ctl).phase(node) == doubts.HEALTHY, timeout=10)
    assert node in {n.node_id for n in _nodes(ctl).view("GPU").nodes}


def test_a_5s_cut_of_one_job_node_moves_its_slot_and_costs_no_node():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake, RULE)
        await ctl.reserve("j", spec("0-7", num_nodes=3))
        uid, cut = stored(fake, "j").uid, stored(fake, "j").slots[0].node_id
        old_group = stored(fake, "j").slots[0].group_id
        fake.cut.add(cut)
        await until(lambda: stored(fake, "j").epoch == 2, timeout=10)  # moved at once
        assert cut not in stored(fake, "j").node_ids()
        assert cut not in {n.node_id for n in _nodes(ctl).view("GPU").nodes}  # kept out
        # Nothing is sent to a node that is away: its old group is kept, not removed.
        assert [(x.group_id, x.node_id) for x in stored(fake, "j").leaving] == [(old_group, cut)]
        assert fake.groups_by_id[old_group].state == "CREATED"
        await asyncio.sleep(5.0)  # the blip lasts 5 s
        fake.cut.discard(cut)
        await _back_in_placement(ctl, cut)
        assert fake.nodes_by_id[cut].swept == [(uid, True)]  # its moved ranks ended there
        assert fake.groups_by_id[old_group].state == "REMOVED"  # once it answered
        await until(lambda: stored(fake, "j").leaving == [])
        assert fake.fenced == {} and fake.nodes_by_id[cut].info.alive  # no node lost
        assert _kinds(fake).count("suspected") == 1 and _kinds(fake).count("back") == 1
        assert stored(fake, "j").state == "ready"
        await ctl.stop()

    run(go())


def test_a_controller_restarted_while_a_suspect_is_away_keeps_it_out_and_sweeps_it_back():
    """Case 4 of the faults in combination: the controller restarts after a cut node's
    slot moved. What is owed on the node's return is in the table with the move (its
    kept group), so the new controller knows the node is in doubt: it keeps the group and
    the node out of placement, watches it, and sweeps it when it answers."""

    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake, RULE)
        await ctl.reserve("j", spec("0-7", num_nodes=3))
        uid, cut = stored(fake, "j").uid, stored(fake, "j").slots[0].node_id
        old_group = stored(fake, "j").slots[0].group_id
        fake.cut.add(cut)
        await until(lambda: stored(fake, "j").epoch == 2, timeout=10)
        await ctl.stop()
        ctl = await controller(fake, RULE)  # Ray restarts it; the node is still cut off
        await asyncio.sleep(2.0)  # many ticks and sweeps of the new controller
        assert _nodes(ctl).phase(cut) == doubts.MOVED
        assert cut not in {n.node_id for n in _nodes(ctl).view("GPU").nodes}
        assert fake.groups_by_id[old_group].state == "CREATED"  # nothing sent to it
        assert [x.group_id for x in stored(fake, "j").leaving] == [old_group]
        fake.cut.discard(cut)
        await _back_in_placement(ctl, cut)
        assert fake.nodes_by_id[cut].swept == [(uid, True)]
        assert fake.groups_by_id[old_group].state == "REMOVED"
        await until(lambda: stored(fake, "j").leaving == [])
        assert fake.fenced == {} and _kinds(fake).count("back") == 1
        assert stored(fake, "j").state == "ready" and stored(fake, "j").epoch == 2
        await ctl.stop()

    run(go())


def test_a_held_spare_cut_off_first_is_held_anew_and_never_takes_the_slot():
    """Case 2 of the faults in combination: the held spare's host is cut off, then a job
    host. The spare is watched like a slot: suspected, dropped and held anew on the free
    host, so the lost slot moves once, onto a live spare, never onto the silent one."""

    async def go():
        fake = cluster(gpu_nodes=4)  # two job hosts, the spare's, one free
        ctl = await controller(fake, RULE)
        await ctl.reserve("j", {**spec("0-7", num_nodes=3), "spares": 1})
        rec = await until(lambda: (r := stored(fake, "j")) and len(r.spares) == 1 and r)
        first = rec.spares[0].node_id
        fake.cut.add(first)
        rec = await until(
            lambda: (r := stored(fake, "j")).spares and r.spares[0].node_id != first and r,
            timeout=10,
        )
        assert first not in {n.node_id for n in _nodes(ctl).view("GPU").nodes}
        lost = rec.slots[0].node_id
        fake.cut.add(lost)
        rec = await until(
            lambda: (r := stored(fake, "j")).epoch == 2 and r.state == "ready" and r, timeout=10
        )
        assert rec.node_ids().isdisjoint({first, lost}), rec.slots
        await asyncio.sleep(2.0)
        assert stored(fake, "j").epoch == 2  # moved once
        await ctl.stop()

    run(go())


def test_a_repair_takes_a_free_host_over_a_held_spare_gone_silent():
    """The spare's host falls silent, and before its silence is judged a job host dies:
    the repair takes the free host, not the spare nobody has heard from since."""

    async def go():
        fake = cluster(gpu_nodes=4)
        ctl = await controller(fake, RULE)
        await ctl.reserve("j", {**spec("0-7", num_nodes=3), "spares": 1})
        rec = await until(lambda: (r := stored(fake, "j")) and len(r.spares) == 1 and r)
        silent = rec.spares[0].node_id
        fake.cut.add(silent)
        await until(lambda: _nodes(ctl).phase(silent) == doubts.SILENT)
        fake.kill_node(rec.slots[0].node_id)
        rec = await until(lambda: (r := stored(fake, "j")).epoch == 2 and r, timeout=10)
        assert silent not in rec.node_ids(), rec.slots
        assert "suspected" not in _kinds(fake)  # moved at once, not after the spare's verdict
        await until(lambda: stored(fake, "j").state == "ready", timeout=10)
        assert stored(fake, "j").epoch == 2
        await ctl.stop()

    run(go())


# Sweeps and ticks every 50 ms, not 5: minutes of the virtual clock pass in ticks that
# are real work (a loaded CI machine ran out of its minute at 5 ms).
FLAPS = msgspec.structs.replace(
    RULE, hold_down_after=3, hold_down_window=600.0, hold_down=30.0,
    liveness_period=0.05, reconcile_period=0.05,
)  # fmt: skip


def test_a_flapping_node_is_held_down_not_fenced_and_takes_no_spare_for_a_while():
    """A node whose link goes down and up: its slot moves to the spare, it comes back
    and is held as the next spare, is suspected again, and again. At the third
    suspicion in the window it is held down: back and healthy, it takes no spare for
    hold_down, is never fenced, and is held as the spare again after."""

    async def go():
        fake = cluster(gpu_nodes=3)  # two job hosts and the spare's: none free
        ctl = await controller(fake, FLAPS)
        await ctl.reserve("j", {**spec("0-7", num_nodes=3), "spares": 1})
        rec = await until(lambda: (r := stored(fake, "j")) and len(r.spares) == 1 and r)
        flapping = rec.slots[0].node_id

        def spare_on_it():
            return [s.node_id for s in stored(fake, "j").spares] == [flapping]

        for cycle in range(3):
            fake.cut.add(flapping)  # down
            await until(lambda c=cycle: _kinds(fake).count("suspected") == c + 1, timeout=10)
            await asyncio.sleep(1.0)
            fake.cut.discard(flapping)  # up
            await until(lambda: _nodes(ctl).phase(flapping) == doubts.HEALTHY, timeout=10)
            if cycle < 2:  # free again: held as the spare, the nearest free node
                await until(spare_on_it, timeout=10)
        assert _kinds(fake).count("held_down") == 1
        began = asyncio.get_running_loop().time()
        await asyncio.sleep(20.0)
        assert stored(fake, "j").spares == [] and flapping not in stored(fake, "j").node_ids()
        assert flapping not in {n.node_id for n in _nodes(ctl).view("GPU").nodes}
        assert fake.fenced == {} and stored(fake, "j").state == "ready"
        await until(spare_on_it, timeout=30)  # once the hold-down is over
        assert asyncio.get_running_loop().time() - began >= FLAPS.hold_down - 2
        await ctl.stop()

    run(go())


def test_a_cut_longer_than_the_grace_is_fenced_after_it():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake, RULE)
        await ctl.reserve("j", spec("0-7", num_nodes=3))
        cut = stored(fake, "j").slots[0].node_id
        fake.cut.add(cut)
        began = asyncio.get_running_loop().time()
        await until(lambda: stored(fake, "j").epoch == 2, timeout=10)
        moved_after = asyncio.get_running_loop().time() - began
        await until(lambda: cut in fake.fenced, timeout=2 * RULE.fence_grace)
        fenced_after = asyncio.get_running_loop().time() - began
        assert moved_after < 2.0 and RULE.fence_grace <= fenced_after < RULE.fence_grace + 2
        assert "grace" in fake.fenced[cut]
        await until(lambda: stored(fake, "j").leaving == [])  # dead: its kept group goes
        await ctl.stop()

    run(go())


def test_a_rack_split_from_the_heads_side_moves_the_job_and_costs_no_node():
    """The job's two nodes reach each other, but not the head nor the idle nodes (a
    rack's uplink down). Every witness stands on the head's side and confirms: both are
    suspected and their slots move to the idle nodes; healed within the grace, both come
    back as free capacity, with nothing of the moved ranks left on them."""

    async def go():
        fake = cluster(gpu_nodes=4)
        ctl = await controller(fake, RULE)
        await ctl.reserve("j", spec("0-7", num_nodes=3))
        rack = stored(fake, "j").node_ids()
        fake.split(rack)
        await until(lambda: not stored(fake, "j").node_ids() & rack, timeout=10)
        assert stored(fake, "j").state == "ready"
        await asyncio.sleep(5.0)
        fake.split()
        for node in rack:
            await _back_in_placement(ctl, node)
        assert fake.fenced == {}
        assert (await ctl.health())["cut_off"] is None
        await ctl.stop()

    run(go())


def test_the_heads_side_split_from_every_job_node_suspects_itself_and_moves_nothing():
    async def go():
        fake = cluster(gpu_nodes=2)
        ctl = await controller(fake, RULE)
        await ctl.reserve("j", spec("0-7", num_nodes=3))
        job = stored(fake, "j").node_ids()
        fake.split(job)  # head | both job nodes: it reaches none of the nodes it asks
        await until(lambda: "cut_off" in _kinds(fake))
        await asyncio.sleep(40.0)
        assert "suspected" not in _kinds(fake) and fake.fenced == {}
        verdicts = await ctl.verdicts("j")
        assert {verdicts[n] for n in job} == {"unknown"}
        fake.split()
        await until(lambda: _kinds(fake).count("cut_off") == 2, timeout=10)
        assert stored(fake, "j").epoch == 1 and stored(fake, "j").node_ids() == job
        await ctl.stop()

    run(go())


def test_a_refusal_by_the_network_is_not_proof():
    """A firewall on the head's host rejects connections to one job node (a TCP reset):
    the controller hears a refusal, the witnesses reach the node. Nothing is proven,
    nothing is suspected: the path from the head is at fault, not the node."""

    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake, RULE)
        await ctl.reserve("j", spec("0-7", num_nodes=3))
        node = stored(fake, "j").slots[0].node_id
        fake.rejecting.add((fake.own_node(), node))
        await until(lambda: fake.calls["witness"] >= 4)
        await asyncio.sleep(10.0)
        assert fake.fenced == {} and "suspected" not in _kinds(fake)
        assert stored(fake, "j").epoch == 1
        await ctl.stop()

    run(go())


def test_a_refused_raylet_heard_refused_by_a_witness_is_fenced_at_once():
    """The node's processes are gone, the host up: its kernel refuses the raylet's port
    to the controller and to the witnesses. That is proof: fenced without waiting to be
    suspected, let alone for the grace."""

    async def go():
        fake = cluster(gpu_nodes=3)
        settings = msgspec.structs.replace(RULE, suspect_after=30.0, refused_confirm=0.2)
        ctl = await controller(fake, settings)
        await ctl.reserve("j", spec("0-7", num_nodes=3))
        node = stored(fake, "j").slots[0].node_id
        fake.crash_node(node)  # refused
        began = asyncio.get_running_loop().time()
        await until(lambda: node in fake.fenced, timeout=5)
        assert asyncio.get_running_loop().time() - began < 2.0
        assert "to the controller and to" in fake.fenced[node]
        await until(lambda: stored(fake, "j").epoch == 2)
        await ctl.stop()

    run(go())


def test_a_refused_raylet_with_no_witness_is_proven_by_its_second_port():
    async def go():
        fake = cluster(gpu_nodes=1)  # the head and one node: nobody else can look
        ctl = await controller(fake, RULE)
        await ctl.reserve("j", spec("0-3", num_nodes=2))
        node = stored(fake, "j").slots[0].node_id
        fake.crash_node(node)
        await until(lambda: node in fake.fenced, timeout=5)
        assert "two of its ports" in fake.fenced[node]
        await ctl.stop()

    run(go())


def test_a_lossy_link_is_never_suspected():
    """30% of the looks at a node's raylet lost, for a minute of sweeps: asked over three
    connections once silent, by the controller and by each witness, it answers now and
    then, and is never suspected."""

    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake, RULE)
        await ctl.reserve("j", spec("0-7", num_nodes=3))
        node = stored(fake, "j").slots[1].node_id
        fake.lossy[node] = 0.3
        await asyncio.sleep(60.0)
        assert "suspected" not in _kinds(fake) and fake.fenced == {}
        assert stored(fake, "j").epoch == 1
        await ctl.stop()

    run(go())


def test_three_silent_nodes_at_once_are_judged_in_one_question_each_round():
    async def go():
        fake = cluster(gpu_nodes=6)
        ctl = await controller(fake, RULE)
        await ctl.reserve("j", spec("0-11", num_nodes=6))
        cut = stored(fake, "j").node_ids()
        asked: list[int] = []
        plain = fake.witness_answers

        async def counted(witness, addresses, timeout, ways=1):
            asked.append(len(addresses))
            return await plain(witness, addresses, timeout, ways)

        fake.witness_answers = counted
        fake.cut.update(cut)
        await until(lambda: not stored(fake, "j").node_ids() & cut, timeout=10)
        assert max(asked) == 3  # every question names all three
        said = [e.message for e in fake.metrics.events if e.kind == "suspected"]
        assert len(said) == 3
        await ctl.stop()

    run(go())


def test_a_suspect_that_answers_before_its_slot_could_move_keeps_it():
    """No spare has room: the suspect's slot stays (degraded, the autoscaler asked); it
    answers again, and the reservation is ready where it was, nothing moved."""

    async def go():
        fake = cluster(gpu_nodes=2)
        ctl = await controller(fake, RULE)
        await ctl.reserve("j", spec("0-7", num_nodes=3))
        node = stored(fake, "j").slots[0].node_id
        fake.links_down.add(frozenset((fake.own_node(), node)))
        other = stored(fake, "j").slots[1].node_id
        fake.links_down.add(frozenset((other, node)))  # the witness cannot reach it either
        await until(lambda: stored(fake, "j").state == "degraded", timeout=10)
        assert stored(fake, "j").cause == "node-suspected"
        fake.links_down.clear()
        await until(lambda: stored(fake, "j").state == "ready", timeout=10)
        assert stored(fake, "j").epoch == 1 and fake.fenced == {}
        assert _nodes(ctl).phase(node) == doubts.HEALTHY
        await ctl.stop()

    run(go())


def test_the_controllers_self_doubt_ends_only_after_sweeps_in_a_row_reach_a_majority():
    doubt = evidence.SelfDoubt(clear_after=2)
    assert doubt.sample(reached=0, asked=3) == "began"
    assert doubt.sample(3, 3) is None  # one lucky sweep in a flapping link
    assert doubt.sample(0, 3) is None and doubt.doubted
    assert doubt.sample(3, 3) is None
    assert doubt.sample(3, 3) == "ended" and not doubt.doubted
    assert doubt.sample(3, 3) is None


def test_witnesses_are_spread_over_the_racks_the_suspects_own_first():
    answered = {"a1": "ok", "a2": "ok", "b1": "ok", "b2": "ok", "c1": "ok", "s": "silent"}
    rack = {"a1": "a", "a2": "a", "b1": "b", "b2": "b", "c1": "c", "s": "b"}
    chosen = evidence.witnesses(answered, {"s"}, 3, lambda n: rack[n])
    assert chosen[0] == "b1" and {rack[n] for n in chosen} == {"a", "b", "c"}
