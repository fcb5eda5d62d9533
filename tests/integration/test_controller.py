"""The detached controller on a real local cluster: reservations, topology, restarts."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import ray
from ray.util.placement_group import placement_group, placement_group_table

import clients
from controller import PlacementError
from controller.errors import (
    ReservationConflict,
    ReservationError,
    ReservationInfeasible,
    ReservationTimeout,
)
from controller.state.scheduling import group_handle
from tests.integration.conftest import live_groups, one_node, restart_controller, wait_for

COLOCATED = {
    "num_nodes": 3,
    "component_placement": {
        "actor,rollout": "0-7",
        "engine": {"placement": "0-7:0-3", "capture_child_tasks": True},
    },
}


# docs/evidence/benchmarks.md: reserve and probe 4 nodes x 8 GPUs in 1.67 s (here 2 x 4);
# attach from a new driver, 64 assignments, in 74 ms. Bounds that a healthy run meets on
# 2 loaded cores and a regression of several times does not.
RESERVE_S = 8.0
ATTACH_S = 0.5


@ray.remote(num_cpus=0)
def _what_i_see():
    return {
        "gpus": sorted(int(g) for g in ray.get_gpu_ids()),
        "node": ray.get_runtime_context().get_node_id(),
    }


def test_topology_agrees_with_group_table_and_workers(ctl):
    res = ctl.reserve("topo", COLOCATED, timeout_s=60)
    assert res.info.state == "ready"
    assert res.info.components == {"actor": 8, "rollout": 8, "engine": 4}
    table = placement_group_table()
    for slot in res.info.slots:
        entry = table[slot.group_id]
        assert entry["state"] == "CREATED"
        assert set(entry["bundles_to_node_id"].values()) == {slot.node_id}
        assert len(entry["bundles"]) == 4
        assert sorted(slot.accelerators) == [0, 1, 2, 3]
    # what a worker scheduled into each bundle sees is what the assignment promised
    for a in res.assignments("actor"):
        opts = a.actor_options()
        seen = ray.get(
            _what_i_see.options(
                num_gpus=a.num_gpus, scheduling_strategy=opts["scheduling_strategy"]
            ).remote()
        )
        assert seen["node"] == a.placement.node_id
        assert seen["gpus"] == a.placement.cuda_visible_devices
        assert a.env["CUDA_VISIBLE_DEVICES"] == str(seen["gpus"][0])
    # a two-GPU engine process is anchored in its first bundle and lists both GPUs
    engine = res.assignments("engine")
    assert [len(a.placement.cuda_visible_devices) for a in engine] == [2, 2, 2, 2]
    assert all(a.capture_child_tasks for a in engine)
    # each engine's first GPU holds actor, rollout, the engine and its first child
    assert [a.num_gpus for a in engine] == [0.25] * 4
    assert [a.child_share for a in engine] == [0.25] * 4
    first = res.assignments("actor")[0]
    assert first.env["RANK"] == "0" and first.env["WORLD_SIZE"] == "8"
    assert first.ray_sets_devices


def test_two_jobs_never_share_an_accelerator(ctl):
    a = ctl.reserve("share-a", one_node("0-1"), timeout_s=30)
    b = ctl.reserve("share-b", one_node("0-1"), timeout_s=30)
    ga = {(x.placement.node_id, x.placement.local_gpu_id) for x in a.assignments("actor")}
    gb = {(x.placement.node_id, x.placement.local_gpu_id) for x in b.assignments("actor")}
    assert len(ga) == len(gb) == 2
    assert not ga & gb
    # a third job wanting the same node's GPUs finds only what is left: 0 free → timeout
    with pytest.raises(ReservationTimeout, match="needs CPU 2, GPU 2; free CPU 0, GPU 0"):
        ctl.reserve("share-c", one_node("0-1"), timeout_s=2)


def test_same_spec_is_idempotent_and_a_different_one_conflicts(ctl):
    first = ctl.reserve("idem", one_node("0-3"), timeout_s=30)
    before = live_groups()
    again = ctl.reserve("idem", one_node("0-3"), timeout_s=30)
    assert again.info == first.info
    assert live_groups() == before
    with pytest.raises(ReservationConflict) as info:
        ctl.reserve("idem", one_node("0-1"), timeout_s=30)
    assert "components[actor].placement: '0-3' -> '0-1'" in str(info.value)
    replaced = ctl.reserve("idem", one_node("0-1"), timeout_s=30, replace=True)
    assert replaced.info.num_accelerators == 2
    assert not set(before) & set(live_groups())


def test_concurrent_reserves_of_one_job_make_one_reservation(ctl):
    results, errors = [], []

    def go():
        try:
            results.append(ctl.reserve("race", one_node("4-7"), timeout_s=30).info)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=go) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len({json.dumps([s.group_id for s in r.slots]) for r in results}) == 1
    prefix = ray.get(ctl.handle.group_prefix.remote()) + "race:"
    assert len(live_groups(prefix)) == 1


def test_second_driver_sees_identical_assignments(ctl, cluster):
    res = ctl.reserve("shared", COLOCATED, timeout_s=60)
    mine = {c: [ray_free(a) for a in res.assignments(c)] for c in res.components}
    script = textwrap.dedent(
        f"""
        import json, time, ray, msgspec, clients
        ray.init(address={cluster.address!r}, logging_level="ERROR", log_to_driver=False)
        t0 = time.perf_counter()
        ctl = clients.connect(start=False)
        res = ctl.reservation("shared")
        out = {{c: msgspec.to_builtins(res.assignments(c)) for c in res.components}}
        print(json.dumps({{"attach_s": time.perf_counter() - t0, "assignments": out}}))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert theirs["assignments"] == mine


def ray_free(assignment):
    import msgspec

    return msgspec.to_builtins(assignment)


def test_controller_restart_keeps_every_reservation(ctl):
    res = ctl.reserve("survivor", COLOCATED, timeout_s=60)
    before_groups = live_groups()
    before_assign = {c: res.assignments(c) for c in res.components}
    restart_controller(ctl)
    assert ctl.status("survivor") == res.info
    assert live_groups() == before_groups  # no new groups, none lost
    fresh = clients.connect(start=False).reservation("survivor")
    assert {c: fresh.assignments(c) for c in fresh.components} == before_assign


def test_crash_between_group_creation_and_table_write_leaves_no_leak(ctl):
    prefix = ray.get(ctl.handle.group_prefix.remote()) + "crashy:"
    incarnation = ctl.check_alive()
    ray.get(ctl.handle.arm_fault.remote("after_create"))
    # The controller dies after creating the groups; Ray restarts it and retries the
    # call; recovery removes the half-made reservation and the retry builds it anew.
    res = ctl.reserve("crashy", one_node("0-3"), timeout_s=60)
    assert res.info.state == "ready"
    assert ctl.check_alive() != incarnation  # it really died and came back
    groups = live_groups(prefix)
    assert set(groups) == {s.group_id for s in res.info.slots}
    ctl.release("crashy")
    wait_for(lambda: not live_groups(prefix), timeout=10)


def test_orphaned_groups_are_removed_on_restart(ctl):
    prefix = ray.get(ctl.handle.group_prefix.remote())
    orphan = placement_group([{"CPU": 0.01}], name=f"{prefix}ghost:abc:0", lifetime="detached")
    ray.get(orphan.ready(), timeout=10)
    foreign = placement_group([{"CPU": 0.01}], name="someone-else", lifetime="detached")
    ray.get(foreign.ready(), timeout=10)
    restart_controller(ctl)
    table = placement_group_table()
    assert table[orphan.id.hex()]["state"] == "REMOVED"
    assert table[foreign.id.hex()]["state"] == "CREATED"  # not placectl's: untouched
    ray.util.remove_placement_group(foreign)


def test_unsatisfiable_reservation_times_out_with_diagnosis_and_leaves_nothing(ctl):
    ctl.reserve("hog", one_node("4-7"), timeout_s=30)
    prefix = ray.get(ctl.handle.group_prefix.remote()) + "starved:"
    progress: list[str] = []
    started = time.monotonic()
    with pytest.raises(ReservationTimeout) as info:
        ctl.reserve("starved", one_node("4-5"), timeout_s=3, progress=progress.append)
    elapsed = time.monotonic() - started
    assert elapsed < 3 + 15  # its timeout, and the rollback (seconds on a loaded machine)
    message = str(info.value)
    assert "1 of 1 node slots unplaced" in message and "needs CPU 2, GPU 2" in message
    assert "free CPU 0, GPU 0" in message
    assert progress and "placed 0 of 1 node slots; waiting for node" in progress[0]
    assert not live_groups(prefix)
    assert [i.job for i in ctl.list()] == ["hog"]


def test_release_frees_every_resource(ctl):
    total = ray.cluster_resources()["GPU"]
    ctl.reserve("big", COLOCATED, timeout_s=60)
    wait_for(lambda: ray.available_resources().get("GPU", 0) == 0)
    assert ctl.release("big") is True
    assert ctl.release("big") is False
    wait_for(lambda: ray.available_resources().get("GPU", 0) == total)
    assert not live_groups(ray.get(ctl.handle.group_prefix.remote()) + "big:")


def test_group_removed_behind_our_back_is_recreated_on_its_node(ctl):
    res = ctl.reserve("fragile", one_node("0-1"), timeout_s=30)
    (slot,) = res.info.slots
    ray.util.remove_placement_group(group_handle(slot.group_id))
    info = wait_for(lambda: (i := ctl.status("fragile")).epoch == 2 and i.state == "ready" and i)
    (again,) = info.slots
    assert again.node_id == slot.node_id and again.group_id != slot.group_id
    assert set(live_groups(ray.get(ctl.handle.group_prefix.remote()) + "fragile:")) == {
        again.group_id
    }


@pytest.mark.parametrize(
    ("job", "spec", "error", "message"),
    [
        ("bad name", one_node(), ReservationError, "job name 'bad name'"),
        ("", one_node(), ReservationError, "job name ''"),
        ("ok", {"num_nodes": 3}, PlacementError, "component_placement: required key"),
        ("ok", one_node("0-99"), PlacementError, "resource rank 99"),
        (
            "ok",
            {"num_nodes": 9, "component_placement": {"a": 0}},
            ReservationTimeout,
            "needs num_nodes=9",
        ),
    ],
)
def test_bad_requests_get_clear_errors_and_leave_the_controller_alive(
    ctl, job, spec, error, message
):
    alive = ctl.check_alive()
    with pytest.raises(error) as info:
        ctl.reserve(job, spec, timeout_s=1)
    assert message in str(info.value)
    assert ctl.check_alive() == alive  # the same incarnation: it never crashed
    assert ctl.list() == []


def test_wrong_types_sent_straight_to_the_actor(ctl):
    alive = ctl.check_alive()
    for call in (
        lambda: ctl.handle.reserve.remote(123, {"num_nodes": 1}),
        lambda: ctl.handle.reserve.remote("x", 42),
        lambda: ctl.handle.reserve.remote("x", one_node(), "soon"),
        lambda: ctl.handle.reserve.remote("x", one_node(), -5),
        lambda: ctl.handle.assignments.remote("nope", "actor"),
        lambda: ctl.handle.release.remote(None),
    ):
        with pytest.raises(ray.exceptions.RayTaskError) as info:
            ray.get(call())
        assert isinstance(info.value.cause, PlacementError)
    assert ctl.check_alive() == alive


def test_a_reservation_that_can_never_fit_is_refused_at_once(ctl):
    # Every GPU of both GPU nodes (1 CPU each, 4 CPUs per node in all) and a node-level
    # process on them: 5 CPUs asked of nodes Ray reports with 4. Refused before any
    # group exists, instead of waiting out the timeout.
    spec = one_node("0-7", reward={"node_group": "node", "placement": "1-2"})
    started = time.monotonic()
    with pytest.raises(ReservationInfeasible, match=r"would need CPU 5; it has CPU 4 in total"):
        ctl.reserve("too-big", spec, timeout_s=120)
    assert time.monotonic() - started < 60
    assert live_groups() == {}
    with pytest.raises(PlacementError, match="no reservation named 'too-big'"):
        ctl.record("too-big")


def test_reserve_and_attach_stay_near_their_figures(ctl):
    spec = {"num_nodes": 3, "component_placement": {"actor": "0-7"}}
    took = []
    for i in range(3):
        started = time.monotonic()
        ctl.reserve(f"fig{i}", spec, timeout_s=120)
        took.append(time.monotonic() - started)
        ctl.release(f"fig{i}")
    assert statistics.median(took) < RESERVE_S, took
    ctl.reserve("attach", spec, timeout_s=120)
    attach = []
    for _ in range(5):
        started = time.monotonic()
        assert len(clients.Controller().reservation("attach").assignments("actor")) == 8
        attach.append(time.monotonic() - started)
    assert statistics.median(attach) < ATTACH_S, attach
    ctl.release("attach")
