"""What placectl does on each Ray release it runs on (controller.ray_versions)."""

import os

import msgspec
import pytest

from controller.errors import PlacementError, ReservationTimeout
from controller.ray_versions import (
    DEMAND_SELECTORS,
    FEATURES,
    NARROW_DEVICES,
    PIN_BY_LABEL,
    ROCKSDB_STORE,
    TOKEN_AUTH,
    has,
    refusal,
)
from controller.state import process_start
from controller.state.assignments import build_assignments
from tests.unit.fakes import (
    cluster,
    controller,
    live_groups,
    run,
    spec,
    stored,
    table_groups,
    until,
)
from tests.unit.test_records import make


def test_before_ray_2_60_devices_placectl_sets_are_set_as_the_process_starts(monkeypatch):
    plan, res = make()
    e = msgspec.structs.replace(
        build_assignments(res, plan)["engine"][1], placement_group_id="ab" * 18
    )
    passed = e.actor_options(ray_version="2.55.0")["runtime_env"]["env_vars"]
    # Ray 2.55 would map device slots 6 and 7 through the list "6,7": not handed to it
    assert "CUDA_VISIBLE_DEVICES" not in passed
    assert passed["PLACECTL_SET_CUDA_VISIBLE_DEVICES"] == "6,7"
    assert passed[process_start.HOOK_VARIABLE] == "controller.state.process_start.set_devices"
    assert e.actor_options(ray_version="2.60.0")["runtime_env"]["env_vars"] == e.env
    # a child's device is Ray's to set there: no one-device list Ray would index by slot
    child = e.child_options(1, ray_version="2.48.0")["runtime_env"]["env_vars"]
    assert "CUDA_VISIBLE_DEVICES" not in child
    assert child["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == ""
    # the hook Ray runs at the process's start: the engine gets its two devices; a child
    # that inherits the carried value with Ray's switch off is left to Ray
    monkeypatch.setattr("os.environ", {**passed})
    process_start.set_devices()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "6,7"
    monkeypatch.setattr("os.environ", {**passed, **child})
    process_start.set_devices()
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    # an isolated one-GPU process: Ray sets it on every release
    one = next(a for a in build_assignments(res, plan)["actor"] if a.ray_sets_devices)
    assert one.runtime_env_vars("2.48.0") == one.runtime_env_vars("2.60.0")


@pytest.mark.parametrize(
    ("version", "lacks"),
    [
        ("2.48.0", {PIN_BY_LABEL, DEMAND_SELECTORS, TOKEN_AUTH, ROCKSDB_STORE, NARROW_DEVICES}),
        ("2.49.1", {TOKEN_AUTH, ROCKSDB_STORE, NARROW_DEVICES}),
        ("2.55.0", {ROCKSDB_STORE, NARROW_DEVICES}),
        ("2.57.0", {NARROW_DEVICES}),
        ("2.60.0", set()),
        ("3.0.0.dev0", set()),
    ],
)
def test_each_release_lacks_what_came_after_it(version, lacks):
    assert {f for f in FEATURES if not has(f, version)} == lacks


def test_a_feature_refused_names_it_the_release_that_has_it_and_the_install():
    assert refusal(ROCKSDB_STORE, "2.55.0") == (
        "the GCS's embedded RocksDB store (RAY_gcs_storage=rocksdb) needs Ray >= 2.57; "
        'this cluster runs Ray 2.55.0 (upgrade every node: pip install "ray[default]>=2.57")'
    )


def test_on_ray_2_48_a_reserve_waiting_for_nodes_asks_no_autoscaler_and_says_why():
    async def go():
        fake = cluster(gpu_nodes=0)
        fake.release = "2.48.0"
        ctl = await controller(fake)
        with pytest.raises(ReservationTimeout) as e:
            await ctl.reserve("j", spec("0-7", num_nodes=3), timeout_s=0.6)
        # Ray 2.48 would place a demand group on a live node (it ignores its selector)
        assert live_groups(fake) == set() and fake.calls["create_demand"] == 0
        assert (
            "; asking the autoscaler for nodes (label selectors on bundles) needs Ray >= 2.49"
            in (str(e.value))
        )
        await ctl.stop()

    run(go())


def test_on_ray_2_48_a_lost_nodes_group_that_ray_moved_to_the_spare_makes_room_for_the_repair():
    async def go():
        fake = cluster(gpu_nodes=3)  # two nodes reserved, one spare
        fake.release = "2.48.0"
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-7"), 5)
        old = stored(fake, "j")
        gpu_nodes = {n for n in fake.alive() if fake.nodes_by_id[n].info.resources.get("GPU")}
        lost, spare = old.slots[1].node_id, (gpu_nodes - old.node_ids()).pop()
        fake.kill_node(lost)
        # Ray 2.48 only hinted at the node: it placed the lost slot's group on the spare
        assert fake.groups_by_id[old.slots[1].group_id].on == [spare] * 4
        rec = await until(lambda: (r := stored(fake, "j")).state == "ready" and r.epoch == 2 and r)
        assert rec.slots[1].node_id == spare and lost not in rec.node_ids()
        assert live_groups(fake) == table_groups(fake)  # the moved group is gone
        await ctl.stop()

    run(go())


def test_a_rocksdb_store_asked_of_a_ray_without_it_is_told_as_memory():
    from controller.runtime.edge.ray_gcs import gcs_store

    rocks = {"RAY_gcs_storage": "rocksdb"}
    assert gcs_store(rocks, "2.57.0") == "rocksdb"
    # Ray 2.55's GCS ignores the variable: a lost head loses the tables, and status says so
    assert gcs_store(rocks, "2.55.0") == "memory"


def test_token_authentication_asked_of_a_ray_without_it_is_refused_before_connecting():
    from clients.versions import check_ray_features

    token = {"RAY_AUTH_MODE": "token"}
    check_ray_features(token, "2.52.0")
    check_ray_features({"RAY_AUTH_MODE": "disabled"}, "2.48.0")
    with pytest.raises(PlacementError) as e:
        check_ray_features(token, "2.48.0")
    assert str(e.value) == (
        "token authentication (RAY_AUTH_MODE=token) needs Ray >= 2.52; "
        'this cluster runs Ray 2.48.0 (upgrade every node: pip install "ray[default]>=2.52")'
    )
