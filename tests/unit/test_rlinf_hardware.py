"""RLinf's cluster block as placectl reads it: hardware units one per entry, one hardware type
per node, RLinf's own keys kept and others refused, errors naming the entry; the rules
and messages of RLinf's scheduler, written as tests."""

from __future__ import annotations

import pytest

from controller import (
    PlacementError,
    SpecError,
    load_spec,
)

ARM = {"label": "arm", "node_ranks": "0-1", "hardware": {"type": "Franka"}}


def with_group(**group):
    return {"num_nodes": 2, "node_groups": [group], "component_placement": {}}


def test_hardware_units_come_one_per_entry():
    spec = load_spec(
        with_group(
            **{
                **ARM,
                "hardware": {
                    "type": "Franka",
                    "configs": [
                        {"node_rank": 0, "robot_ip": "10.0.0.1", "camera_serials": ["1"]},
                        {"node_rank": 1, "robot_ip": "10.0.0.2", "disable_validate": True},
                        {"node_rank": 1, "robot_ip": "10.0.0.3"},
                    ],
                },
            }
        )
    )
    assert spec.node_groups[0].hardware_units == {0: 1, 1: 2}


@pytest.mark.parametrize(
    ("group", "message"),
    [
        ({"label": "node", "node_ranks": 0}, "reserved labels"),
        ({"label": "g", "node_ranks": 2}, "rank 2 is out of range"),
        ({"label": "g", "node_ranks": "0-x"}, "unexpected character"),
        (
            {
                "label": "g",
                "node_ranks": 0,
                "env_configs": [{"node_ranks": 0, "env_vars": [{"A": 1, "B": 2}]}],
            },
            "each entry maps one name to one value",
        ),
        (
            {
                "label": "g",
                "node_ranks": 0,
                "env_configs": [{"node_ranks": 0, "env_vars": ["A=1"]}],
            },
            "expected `object`",
        ),
        (
            {
                "label": "g",
                "node_ranks": "0-1",
                "env_configs": [{"node_ranks": 0}, {"node_ranks": "0-1"}],
            },
            "node 0 is in env_configs\\[0\\] already",
        ),
        (
            {
                "label": "g",
                "node_ranks": "0-1",
                "env_configs": [
                    {"node_ranks": 0, "env_vars": [{"A": 1}]},
                    {"node_ranks": 1, "env_vars": [{"A": 2}]},
                ],
            },
            "A is set in env_configs\\[0\\]",
        ),
        (
            {**ARM, "hardware": {"type": "Franka", "configs": ["10.0.0.1"]}},
            "configs\\[0\\]: expected a mapping",
        ),
        (
            {**ARM, "hardware": {"type": "Franka", "configs": [{"robot_ip": "x"}]}},
            "configs\\[0\\]: node_rank is missing",
        ),
        (
            {**ARM, "hardware": {"type": "Franka", "configs": [{"node_rank": 5}]}},
            "not a node of the group",
        ),
        (
            {**ARM, "hardware": {"type": "Franka", "configs": [{"node_rank": 0, "camera": "x"}]}},
            "unknown field\\(s\\) camera for Franka hardware",
        ),
        (
            {
                **ARM,
                "hardware": {"type": "Franka", "configs": [{"node_rank": 0}, {"node_rank": 0}]},
            },
            "configs\\[1\\]: repeats .*configs\\[0\\]",
        ),
    ],
)
def test_cluster_block_errors_name_the_entry(group, message):
    with pytest.raises(PlacementError, match=message):
        load_spec(with_group(**group))


def test_node_group_entry_must_be_a_mapping_and_num_nodes_positive():
    with pytest.raises(SpecError, match=r"node_groups\[0\]: expected `object`"):
        load_spec({"num_nodes": 1, "node_groups": ["train"], "component_placement": {}})
    with pytest.raises(SpecError, match="num_nodes 0: must be 1-"):
        load_spec({"num_nodes": 0, "component_placement": {}})


def test_one_hardware_type_per_node_across_groups():
    a = {
        "label": "a",
        "node_ranks": 0,
        "hardware": {"type": "Franka", "configs": [{"node_rank": 0}]},
    }
    b = {
        "label": "b",
        "node_ranks": "0-1",
        "hardware": {"type": "Franka", "configs": [{"node_rank": 0}]},
    }
    with pytest.raises(SpecError, match="'a' and 'b' both declare Franka hardware on node 0"):
        load_spec({"num_nodes": 2, "node_groups": [a, b], "component_placement": {}})


def test_rlinfs_own_keys_are_kept_unused_and_others_stay_errors():
    spec = load_spec(
        {
            "num_nodes": 1,
            "component_placement": {"a": 0},
            "auto_scheduler": True,
            "use_pre_process_policy": True,
            "use_wait_before_last_iter_policy": False,
            "recreate_nccl_groups": True,
            "net_emulation": {"enabled": False},
            "tracer": {"enabled": False},
            "profiling": {"backend": "nsight"},
        }
    )
    assert set(spec.unused) == {
        "auto_scheduler",
        "use_pre_process_policy",
        "use_wait_before_last_iter_policy",
        "recreate_nccl_groups",
        "net_emulation",
        "tracer",
        "profiling",
    }
    with pytest.raises(SpecError, match="unknown key 'autoscheduler'"):
        load_spec({"num_nodes": 1, "component_placement": {}, "autoscheduler": True})


# Deliberate difference: RLinf accepts only the robot types it has code for; placectl
# takes any Ray resource as hardware (its units are that resource on the nodes).
def test_any_ray_resource_is_hardware():
    spec = load_spec(with_group(label="g", node_ranks=0, hardware={"type": "gripper"}))
    assert spec.node_groups[0].hardware == "gripper"
