"""Held spares (``cluster.spares``) on the in-memory fake cluster: a reservation holds
whole nodes of its kind as placed, probed groups; a lost node's slot becomes a held one
without a new group; what is taken is taken again; what goes wrong is dropped; nothing
is leaked, swept or counted twice."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from controller.errors import PlacementError, SpecError
from controller.planning.spec import load_spec
from controller.runtime.core.settings import FAST
from controller.state.events import Event
from tests.unit.fakes import (
    assignments,
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


def with_spares(n: int, placement: str = "0-3", num_nodes: int = 3) -> dict:
    return {**spec(placement, num_nodes), "spares": n}


def held(fake, job: str, n: int = 1):
    """The stored record once it holds ``n`` spares."""
    return until(lambda: (r := stored(fake, job)) is not None and len(r.spares) == n and r)


def test_a_reservation_holds_a_whole_node_of_its_kind_outside_itself():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake)
        await ctl.reserve("j", with_spares(1), 5)
        rec = await held(fake, "j")
        (spare,) = rec.spares
        (slot,) = rec.slots
        assert spare.node_id != slot.node_id
        # The fake cluster's own group: placed on that node, with the slot's bundles.
        group = fake.groups_by_id[spare.group_id]
        assert group.node_id == spare.node_id
        assert [b.resources for b in spare.bundles] == [b.resources for b in slot.bundles]
        assert sorted(b.physical_id for b in spare.bundles if b.kind == "accelerator") == [
            0,
            1,
            2,
            3,
        ]
        shown = info(await ctl.status("j"))
        assert shown.spares_wanted == 1 and [s.group_id for s in shown.spares] == [spare.group_id]
        assert live_groups(fake) == table_groups(fake) == {slot.group_id, spare.group_id}
        await ctl.stop()

    run(go())


def test_a_lost_node_takes_the_held_spare_and_a_new_one_is_held():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake)
        await ctl.reserve("j", with_spares(1), 5)
        rec = await held(fake, "j")
        spare, (old,) = rec.spares[0], rec.slots
        lost = old.node_id
        fake.kill_node(lost)
        rec = await until(lambda: (r := stored(fake, "j")).epoch == 2 and r.state == "ready" and r)
        (slot,) = rec.slots
        # The held group itself is the slot now: nothing was placed for the repair.
        assert (slot.group_id, slot.node_id) == (spare.group_id, spare.node_id)
        assert slot.node_rank == old.node_rank
        assert slot.bundles == spare.bundles
        rec = await until(lambda: (r := stored(fake, "j")).spares and r)
        (again,) = rec.spares
        assert again.node_id not in (lost, spare.node_id)
        assert live_groups(fake) - {
            g for g in live_groups(fake) if fake.groups_by_id[g].node_id == lost
        } == table_groups(fake)
        await ctl.stop()

    run(go())


def test_without_a_free_node_it_holds_none_then_takes_one_that_joins():
    async def go():
        fake = cluster(gpu_nodes=1)
        ctl = await controller(fake)
        await ctl.reserve("j", with_spares(1, num_nodes=2), 5)
        assert stored(fake, "j").state == "ready" and stored(fake, "j").spares == []
        fake.add_node(num_gpus=4, num_cpus=4)
        rec = await held(fake, "j")
        assert rec.epoch == 1  # holding changes no assignment
        await ctl.stop()

    run(go())


def test_a_held_spare_whose_node_dies_is_dropped_and_another_taken():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake)
        await ctl.reserve("j", with_spares(1), 5)
        first = (await held(fake, "j")).spares[0]
        fake.kill_node(first.node_id)
        rec = await until(
            lambda: (r := stored(fake, "j")).spares and r.spares[0].node_id != first.node_id and r
        )
        assert rec.state == "ready" and rec.epoch == 1  # a spare's loss is not the job's
        await ctl.stop()

    run(go())


def test_release_removes_the_held_spares_and_a_restart_keeps_them():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake)
        await ctl.reserve("j", with_spares(2), 5)
        rec = await held(fake, "j", 2)
        await ctl.stop()
        ctl = await controller(fake)  # its spares are not orphans to the new one
        assert stored(fake, "j").spares == rec.spares
        assert {s.group_id for s in rec.spares} <= live_groups(fake)
        assert await ctl.release("j") is True
        assert live_groups(fake) == set()
        await ctl.stop()

    run(go())


@pytest.mark.parametrize("bad", [-1, 65, "two"])
def test_a_bad_spares_count_names_the_key_and_the_range(bad):
    with pytest.raises(SpecError, match=r"cluster\.spares"):
        load_spec(with_spares(bad))


def test_standbys_are_the_copied_nodes_ranks_on_the_spare_and_the_repair_names_them():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake)
        comps = {"actor": {"placement": "0-3", "standby": True}}
        await ctl.reserve("j", {"num_nodes": 3, "spares": 1, "component_placement": comps}, 5)
        (spare,) = (await held(fake, "j")).spares
        standing = assignments(await ctl.standbys("j", "actor"))
        assert {a.placement_group_id for a in standing} == {spare.group_id}
        devices = {i: b.physical_id for i, b in enumerate(spare.bundles)}
        for a in standing:  # its bundle's device, and no rank
            assert a.env["PLACECTL_STANDBY"] == "1" and "RANK" not in a.env
            assert "MASTER_ADDR" not in a.env and "MASTER_PORT" not in a.env
            assert a.env["CUDA_VISIBLE_DEVICES"] == str(devices[a.bundle_index])
        fake.kill_node(stored(fake, "j").slots[0].node_id)
        await until(lambda: (r := stored(fake, "j")).epoch == 2 and r.state == "ready")
        repaired = assignments(await ctl.assignments("j", "actor"))
        # Each lost rank's new bundle is a standby's: promotion needs no new process.
        key = lambda a: (a.placement_group_id, a.bundle_index)  # noqa: E731
        assert sorted(map(key, repaired)) == sorted(map(key, standing))
        await ctl.stop()

    run(go())


ENGINE = {"rollout": {"placement": "0-3", "standby": True, "engine": "vllm"}}


def test_a_standby_engines_leases_are_on_its_spare_and_become_its_ranks_on_promotion():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake)
        await ctl.reserve("j", {"num_nodes": 3, "spares": 1, "component_placement": ENGINE}, 5)
        (spare,) = (await held(fake, "j")).spares
        standing = assignments(await ctl.standbys("j", "rollout"))
        got = {}
        for a in standing:
            at = (a.placement_group_id, a.bundle_index)
            ports = await ctl.lease_ports("j", "rollout", 0, 16, True, "engine", standby=at)
            cores = await ctl.lease_cores("j", "rollout", 0, "cores", standby=at)
            again = await ctl.lease_ports("j", "rollout", 0, 16, True, "engine", standby=at)
            assert again == ports  # found again by its name and its bundle
            got[at] = (ports, cores["first"])
        rec = stored(fake, "j")
        assert {x.node_id for x in (*rec.leases, *rec.cores) if x.standby} == {spare.node_id}
        ports = [p for ps, _ in got.values() for p in ps]
        assert len(set(ports)) == len(ports) == 16 * len(standing)  # no two share a port
        assert len({first for _, first in got.values()}) == len(standing)  # nor a core

        fake.kill_node(rec.slots[0].node_id)
        await until(lambda: (r := stored(fake, "j")).epoch == 2 and r.state == "ready")
        rec = stored(fake, "j")
        assert not [x for x in (*rec.leases, *rec.cores) if x.standby]
        for a in assignments(await ctl.assignments("j", "rollout")):
            rank, at = a.placement.rank, (a.placement_group_id, a.bundle_index)
            # The rank's own lease by the same name is the promoted standby's: its ports.
            assert await ctl.lease_ports("j", "rollout", rank, 16, True, "engine") == got[at][0]
            cores = await ctl.lease_cores("j", "rollout", rank, "cores")
            assert cores["first"] == got[at][1]
        await ctl.stop()

    run(go())


def test_the_leases_of_a_lost_spares_standbys_end_with_it_and_bad_bundles_are_named():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake)
        await ctl.reserve("j", {"num_nodes": 3, "spares": 1, "component_placement": ENGINE}, 5)
        (spare,) = (await held(fake, "j")).spares
        at = (spare.group_id, 0)
        await ctl.lease_ports("j", "rollout", 0, 4, True, "engine", standby=at)
        await ctl.lease_cores("j", "rollout", 0, "cores", standby=at)
        for bad, said in (
            ((spare.group_id, 99), "no standby of it in that bundle"),
            (("not-a-group", 0), "held spares: " + spare.group_id),
            ((spare.group_id,), "expected \\(placement group id, bundle index\\)"),
        ):
            with pytest.raises(PlacementError, match=said):
                await ctl.lease_ports("j", "rollout", 0, 4, True, "x", standby=bad)
        fake.kill_node(spare.node_id)
        rec = await until(
            lambda: (r := stored(fake, "j")).spares and r.spares[0].node_id != spare.node_id and r
        )
        assert not [x for x in (*rec.leases, *rec.cores) if x.standby]
        await ctl.stop()

    run(go())


def test_plan_and_status_say_what_is_held(tmp_path, capsys):
    from clients.cli import main
    from clients.render import render_reservation

    conf = tmp_path / "c.yaml"
    conf.write_text(
        "cluster:\n  num_nodes: 2\n  spares: 1\n  component_placement:\n"
        "    actor: {placement: 0-3, standby: true}\n"
    )
    try:
        main(["plan", str(conf), "--nodes", "2", "--gpus-per-node", "4"])
    except SystemExit as e:
        assert e.code in (0, None)
    assert "spares: 1 whole node(s)" in capsys.readouterr().out

    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake)
        await ctl.reserve("j", with_spares(1), 5)
        (spare,) = (await held(fake, "j")).spares
        shown = render_reservation(info(await ctl.status("j")), {})
        assert f"spares: 1 of 1 held: {spare.node_ip}" in shown
        states = {"actor": ["ready", "starting", "ready", "missing"]}
        shown = render_reservation(info(await ctl.status("j")), {}, states)
        assert shown.splitlines()[-1] == "standbys of actor: 2 ready, 1 starting, 1 missing"
        await ctl.stop()

    run(go())


def test_the_history_tells_when_spares_are_held_and_taken():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake)
        await ctl.reserve("j", with_spares(1), 5)
        await held(fake, "j")
        fake.kill_node(stored(fake, "j").slots[0].node_id)
        await until(lambda: (r := stored(fake, "j")).epoch == 2 and r.spares)

        async def told():
            got = msgspec.msgpack.decode(await ctl.events("j"), type=list[Event])
            return [e.message for e in got if e.kind == "spares"]

        said = await until(lambda: _len_at_least(told, 3))
        assert said[0].startswith("spares: 1 of 1 held")
        assert "made a lost node's slot" in said[1] and said[1].startswith("spares: 0 of 1")
        assert said[2].startswith("spares: 1 of 1 held")
        await ctl.stop()

    run(go())


async def _len_at_least(make, n):
    got = await make()
    return got if len(got) >= n else None


def test_a_job_name_reserved_again_holds_its_spares_at_once_with_nothing_of_the_last():
    """What the Holder knew of a released reservation (when to try again, why it held
    fewer) is not the next one's of that name: drivers reserve the same name again after
    a release, and it holds its spare at once, not after the last one's retry."""

    async def go():
        fake = cluster(gpu_nodes=2)
        ctl = await controller(fake, msgspec.structs.replace(FAST, repair_retry=30.0))
        await ctl.reserve("j", with_spares(2), 5)  # one free node: 1 of 2, again in 30 s
        await until(lambda: (r := stored(fake, "j")) and len(r.spares) == 1 and r.spares_short)
        await ctl.release("j")
        await ctl.reserve("j", with_spares(1), 5)
        rec = await held(fake, "j")
        assert rec.spares_short == "" and info(await ctl.status("j")).spares_short == ""
        await ctl.stop()

    run(go())


async def _a_spare_and_another_job():
    """Job ``a`` (node rank 1) holding a spare and job ``b`` (node rank 3) on a head and
    four nodes: the fake cluster, the controller, a's spare's node, b's node, the free
    one."""
    fake = cluster(gpu_nodes=4)
    ctl = await controller(fake)
    await ctl.reserve("b", spec("8-11", num_nodes=5), 5)
    await ctl.reserve("a", with_spares(1, "0-3", num_nodes=5), 5)
    spare = (await held(fake, "a")).spares[0].node_id
    lost = stored(fake, "b").slots[0].node_id
    used = {stored(fake, "a").slots[0].node_id, spare, lost}
    (free,) = [n for n in fake.alive() if n not in used and n != fake.own_node()]
    return fake, ctl, spare, lost, free


def test_a_degraded_job_takes_the_free_node_before_another_job_holds_it_as_a_spare():
    """One free node; at once a job's node dies (it needs that node) and another job's
    held spare's node dies (the Holder would hold the next spare there). The repair
    comes first: the degraded job is whole again on the free node, and the other job
    holds no spare until a node is free."""

    async def go():
        fake, ctl, spare, lost, free = await _a_spare_and_another_job()
        fake.kill_node(spare)
        fake.kill_node(lost)
        b = await until(lambda: (r := stored(fake, "b")).epoch == 2 and r, timeout=10)
        assert b.state == "ready" and b.node_ids() == {free}
        await asyncio.sleep(0.5)
        assert stored(fake, "a").spares == [] and stored(fake, "a").state == "ready"
        await ctl.stop()

    run(go())


def test_a_node_lost_while_another_job_is_holding_the_free_node_as_its_spare_gets_it():
    """The held spare's node dies first and the Holder starts holding the next spare on
    the one free node (its group being made); then another job's node dies. The repair
    of a degraded job comes before a spare: that job is whole again on the free node
    (the spare made meanwhile given up), and the first job holds none until one is free."""

    async def go():
        fake, ctl, spare, lost, free = await _a_spare_and_another_job()
        fake.create_delay = 0.5  # the next spare's group takes a moment to make
        made = fake.calls["create_group"]
        fake.kill_node(spare)
        await until(lambda: fake.calls["create_group"] > made)  # asked for, being made
        fake.kill_node(lost)
        b = await until(
            lambda: (r := stored(fake, "b")).epoch == 2 and r.state == "ready" and r, timeout=10
        )
        assert b.node_ids() == {free}
        await asyncio.sleep(1.0)
        assert stored(fake, "a").spares == [] and stored(fake, "a").state == "ready"
        await ctl.stop()

    run(go())


def test_a_held_spare_is_kept_out_of_its_jobs_rack_while_another_rack_has_room():
    """Two racks of two nodes, the job on one node: the nearest free node is the other
    node of its rack, which a rack's loss (its power, its switch) would take with the
    job's. The spare is held in the other rack."""
    from controller.planning.topology import RACK_LABEL

    async def go():
        fake = cluster(gpu_nodes=0)
        for rack in ("a", "a", "b", "b"):
            fake.add_node(num_gpus=4, num_cpus=4, labels={RACK_LABEL: rack})
        ctl = await controller(fake)
        await ctl.reserve("j", with_spares(1, num_nodes=4), 5)
        rec = await held(fake, "j")
        ((slot,), (spare,)) = rec.slots, rec.spares
        racks = {n.node_id: n.labels[RACK_LABEL] for n in rec.nodes.values()}
        rack_of = {nid: fake.nodes_by_id[nid].info.labels[RACK_LABEL] for nid in fake.nodes_by_id
                   if RACK_LABEL in fake.nodes_by_id[nid].info.labels}  # fmt: skip
        assert racks[slot.node_id] == rack_of[slot.node_id]
        assert rack_of[spare.node_id] != rack_of[slot.node_id]
        await ctl.stop()

    run(go())
