"""The pure side of reservations: slots, assignments, env, ports, spares, the table."""

import msgspec
import pytest

from controller import ClusterView, ComponentPlacement, NodeView, PlacementError, load_spec
from controller.cluster import choose_spare, is_replacement
from controller.environment import worker_env
from controller.ports import PortLease, candidates, ledger
from controller.reservations import (
    ReservationError,
    ReservationRecord,
    Table,
    build_assignments,
    check_job,
    decode_table,
    describe_difference,
    encode_table,
    plan_slots,
)

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
            "engine": "4-7:0-1",
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


def record():
    cp = ComponentPlacement(SPEC, VIEW)
    res = ReservationRecord(job="j", spec=SPEC, view=VIEW, slots=probed(plan_slots(cp, "p:")))
    res.leases = [
        PortLease(node_id="n1", ports=[21000], component="actor", rank=0),
        PortLease(node_id="n1", ports=[21001], component="rollout", rank=0),
        PortLease(node_id="n2", ports=[21002], component="engine", rank=0),
    ]
    return cp, res


def test_one_slot_per_used_node_with_one_bundle_per_resource():
    _, res = record()
    assert [s.node_rank for s in res.slots] == [0, 1, 2]
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


def test_assignments_carry_physical_ids_shares_and_the_environment():
    cp, res = record()
    out = build_assignments(res, cp)
    actor = out["actor"]
    assert [a.placement.cuda_visible_devices for a in actor] == [[4], [5], [6], [7]]
    assert [a.placement.local_gpu_id for a in actor] == [4, 5, 6, 7]
    assert [a.bundle_index for a in actor] == [0, 1, 2, 3]
    assert {a.num_gpus for a in actor} == {0.5} and {a.num_cpus for a in actor} == {1.0}
    assert {a.placement_group_id for a in actor} == {"g1"}
    env = actor[1].env
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "4" and env["LOCAL_RANK"] == "1"
    assert env["MASTER_ADDR"] == "10.0.0.2" and env["MASTER_PORT"] == "21000"
    assert env["CUDA_VISIBLE_DEVICES"] == "5"
    assert env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1"
    assert out["rollout"][0].env["MASTER_PORT"] == "21001"
    engine = out["engine"]  # two GPUs each, anchored in the first one's bundle
    assert [a.placement.cuda_visible_devices for a in engine] == [[4, 5], [6, 7]]
    assert [a.bundle_index for a in engine] == [0, 2] and engine[0].num_gpus == 1.0
    env_ = out["env"]  # two processes share one robot: a hardware resource, no GPU
    assert [a.resources for a in env_] == [{"franka": 0.5}] * 2
    assert env_[0].num_gpus == 0 and env_[0].env["CUDA_VISIBLE_DEVICES"] == ""
    assert env_[0].env["ROBOT"] == "panda" and env_[0].python == "/venv/py"
    svc = out["svc"]
    assert svc[0].placement.node_ip == "10.0.0.1" and svc[0].num_cpus == 2.0
    assert "MASTER_PORT" not in svc[0].env  # no lease given for it in this record


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
        worker_env(spec, "j", 1, p, "10.0.0.1", 20000)
    with pytest.raises(PlacementError, match="env sets MASTER_ADDR"):
        worker_env(SPEC, "j", 1, p, "x", 1, user_env={"MASTER_ADDR": "y"})


def test_accelerator_other_than_gpu_uses_its_own_variable_and_resource():
    spec = load_spec({"num_nodes": 1, "accelerator": "NPU", "component_placement": {"a": "0-1"}})
    cp = ComponentPlacement(spec, ClusterView.uniform(1, 2))
    res = ReservationRecord(job="n", spec=spec, view=cp.view, slots=probed(plan_slots(cp, "p:"), 0))
    a = build_assignments(res, cp)["a"][1]
    assert a.num_gpus == 0 and a.resources == {"NPU": 1.0}
    assert a.env["ASCEND_RT_VISIBLE_DEVICES"] == "1"
    assert a.env["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] == "1"


def test_port_candidates_skip_leased_ones_and_wrap():
    held = ledger(
        [
            PortLease(node_id="a", ports=[20001, 20002], component="x", rank=0),
            PortLease(node_id="b", ports=[20000], component="y", rank=0),
        ]
    )
    assert held == {"a": {20001, 20002}, "b": {20000}}
    assert candidates(20000, 20004, held["a"], start=3) == [20003, 20004, 20000]


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


def test_table_round_trip_and_version_check():
    _, res = record()
    table = Table(reservations={"j": res})
    assert decode_table(encode_table(table)) == table
    assert decode_table(None) == Table()
    future = msgspec.msgpack.encode({"version": 99, "reservations": {}})
    with pytest.raises(ReservationError, match="version 99"):
        decode_table(future)


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
