"""An engine's share of its node's cores and its leased ports (clients.engines). What vLLM
does with them is checked against the real engine in tests/engines."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from clients import engines
from controller import PlacementError
from controller.planning.spec import load_spec

SPEC = load_spec(
    {
        "num_nodes": 1,
        "component_placement": {"actor": "0", "rollout": {"placement": "1", "engine": "vllm"}},
    }
)


def test_engines_of_one_node_get_disjoint_runs_split_between_their_workers():
    cores = list(range(16))
    lists = [engines.share_of_cores(cores, i, 2, 2) for i in range(2)]
    assert lists == [[[0, 1, 2, 3], [4, 5, 6, 7]], [[8, 9, 10, 11], [12, 13, 14, 15]]]
    # cores a container or Ray left the process need not start at 0 or be contiguous
    assert engines.share_of_cores([9, 3, 5, 7, 3], 0, 1, 2) == [[3, 5], [7, 9]]
    assert engines.share_of_cores(range(7), 2, 3, 1) == [[4, 5]]  # the remainder unused


def test_too_few_cores_is_an_error_with_both_numbers():
    with pytest.raises(PlacementError, match=r"2 core\(s\) on this node for 2 engine process"):
        engines.share_of_cores([0, 1], 0, 2, 2)
    with pytest.raises(PlacementError, match=r"process 2 of 2 on the node: out of range \(0-1\)"):
        engines.share_of_cores(range(8), 2, 2, 1)
    with pytest.raises(PlacementError, match="0 engine workers"):
        engines.share_of_cores(range(8), 0, 1, 0)


def test_the_bind_string_is_vllms_form():
    assert engines.bind_string([[0, 1, 2], [3]]) == "0-2|3"
    assert engines.bind_string([[0, 2, 3, 7]]) == "0,2-3,7"


def test_a_rank_takes_its_share_of_the_cores_it_may_run_on(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {4, 5, 6, 7})
    env = {
        "PLACECTL_JOB": "j",
        "NODE_LOCAL_RANK": "1",
        "NODE_LOCAL_WORLD_SIZE": "2",
        "PLACECTL_BUNDLE_INDICES": "2,3",
    }
    monkeypatch.setattr(os, "environ", env)
    assert engines.vllm_environment() == {"VLLM_CPU_OMP_THREADS_BIND": "6|7"}  # 2 bundles
    assert engines.vllm_environment(1) == {"VLLM_CPU_OMP_THREADS_BIND": "6-7"}
    with pytest.raises(PlacementError, match="0 engine workers: expected at least 1"):
        engines.vllm_environment(0)
    monkeypatch.setattr(os, "environ", {"PLACECTL_JOB": "j"})
    with pytest.raises(PlacementError, match="not a placectl worker: NODE_LOCAL_RANK"):
        engines.vllm_environment()


def test_a_rank_with_a_core_lease_binds_its_units_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    env = {"PLACECTL_JOB": "j", "NODE_LOCAL_RANK": "0", "NODE_LOCAL_WORLD_SIZE": "2"}
    env |= {"PLACECTL_CPU_UNITS": "4-7", "PLACECTL_NODE_CPUS": "8"}
    monkeypatch.setattr(os, "environ", env)
    assert engines.vllm_environment(2) == {"VLLM_CPU_OMP_THREADS_BIND": "4-5|6-7"}
    # a node that declares more CPUs than it has: units spread over the cores there
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert engines.vllm_environment(1) == {"VLLM_CPU_OMP_THREADS_BIND": "1"}
    with pytest.raises(PlacementError, match="every worker needs a core of its own"):
        engines.vllm_environment(2)


def test_the_user_cannot_set_an_engines_cores():
    with pytest.raises(PlacementError, match=r"env sets PLACECTL_CPU_UNITS='0-1'"):
        engines.engine_environment(_Reservation(), "rollout", {"PLACECTL_CPU_UNITS": "0-1"})


class _Reservation:
    def __init__(self):
        self.spec = SPEC
        self.calls = []

    def lease_ports(self, component, rank, count, consecutive, name, standby=None):
        self.calls.append((component, rank, count, consecutive, name, standby))
        return list(range(30000, 30000 + count))

    def lease_cores(self, component, rank, name, standby=None):
        self.calls.append((component, rank, name, standby))
        return {"first": 2, "count": 2, "node_cpus": 8, "node_id": name.split("@")[1]}


def _assignment(node: str, rank: int = 0, env: dict | None = None):
    return SimpleNamespace(
        placement=SimpleNamespace(node_id=node, rank=rank),
        placement_group_id="pg",
        bundle_index=3,
        env=env or {},
    )


def test_an_engine_ranks_port_comes_from_a_lease_on_its_node():
    res = _Reservation()
    assert engines.engine_environment(res, "actor", None) is None  # not an engine
    ports = engines.engine_environment(res, "rollout", {"OTHER": "1"})
    want = {"VLLM_PORT": "30000", "PLACECTL_SERVER_PORT": "30000"}
    want |= {"PLACECTL_CPU_UNITS": "2-3", "PLACECTL_NODE_CPUS": "8"}
    assert ports(_assignment("n1")) == want
    assert ports(_assignment("n2")) == want
    # one lease of each per node: a rank moved to another node leases there
    # A standby (on a held spare) leases for its bundle, under the names its rank would.
    assert ports(_assignment("n3", env={"PLACECTL_STANDBY": "1"})) == want
    assert res.calls == [
        ("rollout", 0, engines.ENGINE_PORTS, True, "engine@n1", None),
        ("rollout", 0, 1, True, "server@n1", None),
        ("rollout", 0, "cores@n1", None),
        ("rollout", 0, engines.ENGINE_PORTS, True, "engine@n2", None),
        ("rollout", 0, 1, True, "server@n2", None),
        ("rollout", 0, "cores@n2", None),
        ("rollout", 0, engines.ENGINE_PORTS, True, "engine@n3", ("pg", 3)),
        ("rollout", 0, 1, True, "server@n3", ("pg", 3)),
        ("rollout", 0, "cores@n3", ("pg", 3)),
    ]


def test_the_user_cannot_set_an_engines_port():
    with pytest.raises(PlacementError, match=r"env sets VLLM_PORT='8000' for 'rollout'"):
        engines.engine_environment(_Reservation(), "rollout", {"VLLM_PORT": "8000"})
