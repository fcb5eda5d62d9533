"""The pure side of reservations: slots, assignments, the worker environment, the storage
format and its migration, spares. No Ray."""

import json
import pathlib

import msgspec
import pytest

from controller import ClusterView, ComponentPlacement, NodeView, PlacementError, load_spec
from controller.errors import ReservationError, TableUnreadable
from controller.planning.spec_edit import describe_difference
from controller.state.assignments import build_assignments
from controller.state.environment import worker_env
from controller.state.leases import PortLease, candidates, ledger, pick_run
from controller.state.plan import JobPlan, plan_slots
from controller.state.records import READY, ReservationRecord
from controller.state.requests import check_job, check_timeout
from controller.state.spares import choose_spare, is_replacement
from controller.state.table import StoredPlan, check_meta, decode, encode, migrate_v1

DATA = pathlib.Path(__file__).parent / "data"
VIEW = ClusterView(
    nodes=[
        NodeView(num_gpus=0, node_id="head", ip="10.0.0.1", is_head=True),
        NodeView(num_gpus=4, node_id="n1", ip="10.0.0.2"),
        NodeView(num_gpus=4, node_id="n2", ip="10.0.0.3", resources={"franka": 1}),
    ]
)
SPEC = load_spec(
    {
        "num_nodes": 3,
        "cpus_per_accelerator": 2,
        "node_groups": [
            {
                "label": "arm",
                "node_ranks": 2,
                "hardware": {"type": "franka"},
                "env_configs": [
                    {"env_vars": [{"ROBOT": "panda"}], "python_interpreter_path": "/venv/py"}
                ],
            }
        ],
        "component_placement": {
            "actor,rollout": "0-3",
            "engine": {"placement": "4-7:0-1", "capture_child_tasks": True},
            "env": {"node_group": "arm", "placement": "0:0-1"},
            "svc": {"node_group": "node", "placement": "0"},
        },
    }
)


def probed(slots, offset=4):
    """Pretend the probe found physical id = planned index + offset, groups g<i>."""
    out = []
    for i, s in enumerate(slots):
        bundles = [
            msgspec.structs.replace(b, physical_id=b.local_index + offset)
            if b.kind == "accelerator"
            else b
            for b in s.bundles
        ]
        out.append(msgspec.structs.replace(s, group_id=f"g{i}", bundles=bundles))
    return out


def make(spec=SPEC, view=VIEW, offset=4):
    plan = JobPlan.of(ComponentPlacement(spec, view))
    nodes = {nr: view.nodes[nr] for nr in plan.node_ranks()}
    res = ReservationRecord(
        job="j",
        uid="u1",
        epoch=3,
        spec=spec,
        nodes=nodes,
        slots=probed(plan_slots(plan, spec, nodes, "p:"), offset),
        world_sizes=plan.world_sizes(),
        state=READY,
        leases=[
            PortLease(node_id="n1", ports=[21000], component="actor", rank=0),
            PortLease(node_id="n1", ports=[21001], component="rollout", rank=0),
            PortLease(node_id="n2", ports=[21002], component="engine", rank=0),
        ],
    )
    return plan, res


def test_one_slot_per_used_node_with_one_bundle_per_resource():
    _, res = make()
    assert [s.node_rank for s in res.slots] == [0, 1, 2]
    assert sorted(res.nodes) == [0, 1, 2]
    head, n1, n2 = res.slots
    assert [b.kind for b in head.bundles] == ["node"]
    assert [(b.kind, b.local_index) for b in n1.bundles] == [("accelerator", g) for g in range(4)]
    assert n1.bundles[0].resources == {"GPU": 1.0, "CPU": 2.0}
    assert [(b.kind, b.local_index) for b in n2.bundles] == [
        *[("accelerator", g) for g in range(4)],
        ("hardware", 0),
    ]
    assert n2.bundles[-1].resources == {"franka": 1.0, "CPU": 2.0}
    assert [s.group_name for s in res.slots] == ["p:0", "p:1", "p:2"]


def test_record_keeps_only_the_nodes_it_uses():
    view = ClusterView(nodes=[NodeView(num_gpus=4, node_id=f"n{i}") for i in range(8)])
    spec = load_spec({"num_nodes": 8, "component_placement": {"a": "8-11"}})
    _, res = make(spec, view)
    assert list(res.nodes) == [2] and [s.node_id for s in res.slots] == ["n2"]


def test_assignments_carry_physical_ids_shares_and_the_environment():
    plan, res = make()
    out = build_assignments(res, plan)
    actor = out["actor"]
    assert [a.placement.cuda_visible_devices for a in actor] == [[4], [5], [6], [7]]
    assert [a.placement.local_gpu_id for a in actor] == [4, 5, 6, 7]
    assert [a.bundle_index for a in actor] == [0, 1, 2, 3]
    assert {a.num_gpus for a in actor} == {0.5} and {a.num_cpus for a in actor} == {1.0}
    assert {a.placement_group_id for a in actor} == {"g1"}
    assert {(a.uid, a.epoch) for a in actor} == {("u1", 3)}
    env = actor[1].env
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "4"
    assert env["MASTER_ADDR"] == "10.0.0.2" and env["MASTER_PORT"] == "21000"
    assert env["PLACECTL_UID"] == "u1" and env["PLACECTL_EPOCH"] == "3"
    assert out["rollout"][0].env["MASTER_PORT"] == "21001"
    svc = out["svc"]
    assert svc[0].placement.node_ip == "10.0.0.1" and svc[0].num_cpus == 2.0
    assert "MASTER_PORT" not in svc[0].env  # no lease given for it in this record


def test_isolated_single_device_processes_let_ray_set_their_devices():
    plan, res = make()
    a = build_assignments(res, plan)["actor"][2]
    # LOCAL_RANK indexes its own device in its one-device list: torch's set_device(0)
    assert a.env["LOCAL_RANK"] == "0" and a.env["LOCAL_WORLD_SIZE"] == "1"
    assert a.env["NODE_LOCAL_RANK"] == "2" and a.env["NODE_LOCAL_WORLD_SIZE"] == "4"
    assert a.placement.local_rank == 2
    assert a.ray_sets_devices and a.env["CUDA_VISIBLE_DEVICES"] == "6"
    # Ray sets the variable from the bundle: nothing of placectl's reaches children
    passed = a.runtime_env_vars()
    assert "CUDA_VISIBLE_DEVICES" not in passed
    assert passed["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == ""


def test_engines_list_their_bundles_and_the_share_of_their_children():
    plan, res = make()
    engine = build_assignments(res, plan)["engine"]  # two GPUs each, alone on node 2
    assert [a.placement.cuda_visible_devices for a in engine] == [[4, 5], [6, 7]]
    assert [a.bundle_indices for a in engine] == [[0, 1], [2, 3]]
    assert [a.bundle_index for a in engine] == [0, 2]
    # on its first GPU the engine and its first child split it; alone on the second
    assert [a.num_gpus for a in engine] == [0.5, 0.5]
    assert [a.child_share for a in engine] == [0.5, 0.5]
    e = engine[1]
    assert not e.ray_sets_devices
    assert e.env["CUDA_VISIBLE_DEVICES"] == "6,7" and e.env["LOCAL_RANK"] == "0"
    assert e.env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1"
    assert e.env["PLACECTL_BUNDLE_INDICES"] == "2,3" and e.env["PLACECTL_CHILD_SHARE"] == "0.5"
    assert "VLLM_RAY_BUNDLE_INDICES" not in e.env
    # Its second child: the rest of its second GPU, in that GPU's bundle, inside the group.
    e = msgspec.structs.replace(e, placement_group_id="ab" * 18)  # a group id as Ray's
    child = e.child_options(1, ray_version="2.60.0")
    assert (
        child["num_gpus"] == 0.5 and child["runtime_env"]["env_vars"]["CUDA_VISIBLE_DEVICES"] == "7"
    )
    strategy = child["scheduling_strategy"]
    assert strategy.placement_group_bundle_index == 3
    assert strategy.placement_group_capture_child_tasks
    assert strategy.placement_group.id.hex() == e.placement_group_id


def test_vllm_engines_get_vllms_variables_and_leave_devices_to_ray():
    spec = load_spec(
        {
            "num_nodes": 3,
            "component_placement": {
                "actor,rollout": "0-7",
                "llm": {"placement": "0-7:0-3", "engine": "vllm"},
            },
        }
    )
    plan, res = make(spec, offset=0)
    llm = build_assignments(res, plan)["llm"]
    assert [a.capture_child_tasks for a in llm] == [True] * 4
    first = llm[0]
    # GPU 0: actor, rollout, the engine process and its first child: 1/4 each
    assert first.num_gpus == 0.25 and first.child_share == 0.25
    assert first.env["VLLM_RAY_BUNDLE_INDICES"] == "0,1"
    assert first.env["VLLM_RAY_PER_WORKER_GPUS"] == "0.25"
    assert first.ray_sets_devices and first.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert first.env["LOCAL_RANK"] == "0"


def test_isolate_false_local_rank_indexes_the_shared_list():
    spec = load_spec(
        {"num_nodes": 3, "component_placement": {"x": {"placement": "0-3:0-1", "isolate": False}}}
    )
    plan, res = make(spec, offset=0)
    x = build_assignments(res, plan)["x"]
    assert [a.env["CUDA_VISIBLE_DEVICES"] for a in x] == ["0,1,2,3"] * 2
    assert [a.env["LOCAL_RANK"] for a in x] == ["0", "2"]
    assert [a.env["LOCAL_WORLD_SIZE"] for a in x] == ["2", "2"]
    assert [a.env["NODE_LOCAL_RANK"] for a in x] == ["0", "1"]
    assert not any(a.ray_sets_devices for a in x)


def test_hardware_and_node_processes_hold_no_accelerator():
    plan, res = make()
    out = build_assignments(res, plan)
    env_ = out["env"]  # two processes share one robot: a hardware resource, no GPU
    assert [a.resources for a in env_] == [{"franka": 0.5}] * 2
    # ...and, as in RLinf, they see every accelerator of the robot's node, held by the job
    assert env_[0].num_gpus == 0 and env_[0].env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert [a.env["LOCAL_RANK"] for a in env_] == ["0", "1"]
    assert env_[0].env["ROBOT"] == "panda" and env_[0].python == "/venv/py"


def test_child_options_errors_without_ray():
    plan, res = make()
    actor = build_assignments(res, plan)["actor"][0]
    with pytest.raises(PlacementError, match="starts no children"):
        actor.child_options(0)


def test_node_group_env_may_not_set_placectl_keys():
    spec = load_spec(
        {
            "num_nodes": 1,
            "node_groups": [
                {"label": "g", "node_ranks": 0, "env_configs": [{"env_vars": {"RANK": 3}}]}
            ],
            "component_placement": {"a": {"node_group": "g", "placement": 0}},
        }
    )
    p = ComponentPlacement(spec, ClusterView.uniform(1, 1)).placements("a")[0]
    with pytest.raises(PlacementError, match="node group env_vars sets RANK"):
        worker_env(spec, "j", "u", 1, p, "10.0.0.1", 20000)


def test_accelerator_other_than_gpu_uses_its_own_variable_and_resource():
    spec = load_spec({"num_nodes": 1, "accelerator": "NPU", "component_placement": {"a": "0-1"}})
    plan, res = make(spec, ClusterView.uniform(1, 2), offset=0)
    a = build_assignments(res, plan)["a"][1]
    assert a.num_gpus == 0 and a.resources == {"NPU": 1.0}
    assert a.env["ASCEND_RT_VISIBLE_DEVICES"] == "1"
    assert a.env["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] == ""


def test_port_candidates_skip_leased_ones_and_wrap():
    held = ledger(
        [
            PortLease(node_id="a", ports=[20001, 20002], component="x", rank=0),
            PortLease(node_id="b", ports=[20000], component="y", rank=0),
        ]
    )
    assert held == {"a": {20001, 20002}, "b": {20000}}
    assert candidates(20000, 20004, held["a"], start=3) == [20003, 20004, 20000]
    assert pick_run([5, 7, 8, 9, 11], 3, True) == [7, 8, 9]
    assert pick_run([5, 7, 9], 2, True) == [] and pick_run([5, 7, 9], 2, False) == [5, 7]


def test_spare_must_be_the_same_kind_of_node_with_room():
    dead = NodeView(num_gpus=4, labels={"rack": "a", "ray.io/node-id": "x"}, node_id="x")
    other_rack = NodeView(num_gpus=4, labels={"rack": "b"}, node_id="y")
    fewer = NodeView(num_gpus=2, labels={"rack": "a"}, node_id="z")
    good = NodeView(num_gpus=4, labels={"rack": "a", "ray.io/node-id": "w"}, node_id="w")
    assert is_replacement(dead, good) and not is_replacement(dead, other_rack)
    free = {"w": {"GPU": 4, "CPU": 4}, "z": {"GPU": 2, "CPU": 4}}
    need = {"GPU": 4.0, "CPU": 4.0}
    assert choose_spare(dead, [other_rack, fewer, good], free, need, set()) is good
    assert choose_spare(dead, [good], free, need, {"w"}) is None
    assert choose_spare(dead, [good], {"w": {"GPU": 3}}, need, set()) is None


@pytest.mark.parametrize(
    ("label", "value"),
    [
        ("ray.io/accelerator-type", "H100"),
        ("ray.io/node-group", "spot-pool"),
        ("ray.io/market-type", "SPOT"),
    ],
)
def test_spare_must_match_rays_kind_labels(label, value):
    dead = NodeView(num_gpus=8, labels={label: "A100"}, node_id="x")
    other = NodeView(num_gpus=8, labels={label: value}, node_id="y")
    same = NodeView(num_gpus=8, labels={label: "A100", "ray.io/availability-zone": "b"})
    assert not is_replacement(dead, other)
    assert is_replacement(dead, same)  # where a node is says nothing about what it is


def test_spare_must_match_accelerator_type_resources_and_selectors():
    dead = NodeView(num_gpus=8, resources={"accelerator_type:A100": 1.0}, node_id="x")
    h100 = NodeView(num_gpus=8, resources={"accelerator_type:H100": 1.0}, node_id="y")
    assert not is_replacement(dead, h100)
    a = NodeView(num_gpus=8, resources={"accelerator_type:A100": 1.0}, node_id="a")
    b = NodeView(
        num_gpus=8, resources={"accelerator_type:A100": 1.0}, labels={"pool": "gold"}, node_id="b"
    )
    dead_gold = msgspec.structs.replace(dead, labels={"pool": "gold"})
    free = {"a": {"GPU": 8}, "b": {"GPU": 8}}
    assert choose_spare(dead_gold, [a, b], free, {"GPU": 8}, set(), [{"pool": "gold"}]) is b


def test_records_round_trip_and_newer_versions_are_refused():
    plan, res = make()
    assert decode(encode(res), ReservationRecord, "r") == res
    stored = StoredPlan(job="j", uid="u1", epoch=3, plan=plan)
    assert decode(encode(stored), StoredPlan, "p") == stored
    newer = msgspec.msgpack.encode({**msgspec.to_builtins(res), "v": 99})
    with pytest.raises(TableUnreadable, match="schema version 99, written by a newer placectl"):
        decode(newer, ReservationRecord, "record 'j'")
    with pytest.raises(TableUnreadable, match="not valid msgpack"):
        decode(b"\xc1garbage", ReservationRecord, "record 'j'")
    with pytest.raises(TableUnreadable, match="cannot be decoded"):
        decode(msgspec.msgpack.encode({"v": 2, "job": 3}), ReservationRecord, "record 'j'")
    with pytest.raises(TableUnreadable, match="format 7"):
        check_meta(msgspec.msgpack.encode({"format": 7}))
    check_meta(None)


def test_format_1_table_written_by_placectl_0_1_migrates_without_moving_anything():
    # table_v1.msgpack was written by placectl 0.1's own encode_table (commit 2c84e9a),
    # and table_v1_assignments.json holds the assignments 0.1 computed from it.
    migrated = {m.record.job: m for m in migrate_v1((DATA / "table_v1.msgpack").read_bytes())}
    old = json.loads((DATA / "table_v1_assignments.json").read_text())
    assert sorted(migrated) == ["grpo", "small"]
    grpo = migrated["grpo"]
    assert grpo.record.uid == "v1-abc123" and grpo.record.epoch == 3
    assert grpo.record.state == "ready" and migrated["small"].record.state == "degraded"
    assert sorted(grpo.record.nodes) == [0, 1, 2]
    assert sorted(migrated["small"].record.nodes) == [1]  # only the nodes it uses
    for job, m in migrated.items():
        for name, block in m.published.components.items():
            for new, was in zip(block.assignments(), old[job][name], strict=True):
                new = msgspec.to_builtins(new)
                for k in ("placement_group_id", "bundle_index", "capture_child_tasks"):
                    assert new[k] == was[k], (job, name, k)
                for k in ("rank", "node_id", "node_ip", "cuda_visible_devices", "local_gpu_id"):
                    assert new["placement"][k] == was["placement"][k], (job, name, k)
                assert new["env"].get("MASTER_PORT") == was["env"].get("MASTER_PORT")
    # the same bytes migrate to the same records (a crash mid-migration is harmless)
    again = migrate_v1((DATA / "table_v1.msgpack").read_bytes())
    assert [m.record for m in again] == [migrated[j].record for j in sorted(migrated)]


def test_a_table_that_is_not_format_1_is_refused_not_read_as_empty():
    with pytest.raises(TableUnreadable, match="version 9"):
        migrate_v1(msgspec.msgpack.encode({"version": 9, "reservations": {}}))
    with pytest.raises(TableUnreadable):
        migrate_v1(b"\x00\x01")


def test_spec_differences_are_named():
    a = load_spec({"num_nodes": 2, "component_placement": {"actor": "0-3", "ref": 0}})
    b = load_spec({"num_nodes": 3, "component_placement": {"actor": "0-7"}})
    text = describe_difference(a, b)
    assert "num_nodes: 2 -> 3" in text
    assert "components[actor].placement: '0-3' -> '0-7'" in text
    assert "components[ref] removed" in text
    assert describe_difference(a, a) == "no difference"


@pytest.mark.parametrize("job", ["", "a b", "x" * 129, "-lead", "a:b", None, 3])
def test_bad_job_names(job):
    with pytest.raises(ReservationError, match="job name"):
        check_job(job)


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), "5", True, 86_401])
def test_bad_timeouts(value):
    with pytest.raises(ReservationError, match="timeout_s"):
        check_timeout(value)


def test_a_legacy_record_whose_plan_no_longer_matches_its_slots_is_refused():
    import msgspec as m

    table = m.msgpack.decode((DATA / "table_v1.msgpack").read_bytes())
    record = table["reservations"]["small"]
    record["slots"][0]["node_rank"] = 2  # its slot is no longer where its plan puts it
    with pytest.raises(TableUnreadable, match="'small' cannot be migrated"):
        migrate_v1(m.msgpack.encode(table))
