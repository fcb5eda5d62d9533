"""Which components OpenRLHF's actor groups and vLLM engines can run on, judged on
placectl's assignments. The oracle for the training rule is OpenRLHF's own
``ray_noset_visible_devices`` (loaded from the installed package's file, as OpenRLHF's
tests load its modules): a component is refused exactly where OpenRLHF, given the
environment placectl hands the actor, would take ``LOCAL_RANK`` from the physical GPU id.
No Ray."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from clients.integrations.openrlhf_layout import engine_layout, training_layout
from controller import ClusterView, NodeView, PlacementError, load_spec
from controller.state.assignments import build_assignments
from tests.unit.test_records import make

VIEW = ClusterView(
    nodes=[
        NodeView(num_gpus=4, node_id="n0", ip="10.0.0.1"),
        NodeView(num_gpus=4, node_id="n1", ip="10.0.0.2"),
    ]
)


def _openrlhf_noset():
    spec = importlib.util.find_spec("openrlhf")
    if spec is None:
        pytest.skip("openrlhf==0.11.2 is installed by scripts/test")
    path = Path(spec.submodule_search_locations[0]) / "trainer" / "ray" / "utils.py"
    module_spec = importlib.util.spec_from_file_location("_openrlhf_ray_utils", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.ray_noset_visible_devices


def assignments(placement: dict, component: str = "actor"):
    spec = load_spec({"num_nodes": 2, "component_placement": placement})
    plan, res = make(spec, VIEW, offset=0)
    return build_assignments(res, plan)[component]


def test_single_gpu_isolated_components_run_and_openrlhf_keeps_local_rank_0():
    noset = _openrlhf_noset()
    for placement, component, expected in [
        ({"actor,ref": "0-3"}, "ref", (1, 4)),
        ({"actor": "0-7"}, "actor", (2, 4)),
        ({"actor": "0-3", "rollout": {"placement": "0-3:0-1", "engine": "vllm"}}, "actor", (1, 4)),
    ]:
        found = assignments(placement, component)
        assert training_layout(component, found, 1) == expected
        assert not any(noset(a.runtime_env_vars()) for a in found), placement


@pytest.mark.parametrize(
    ("placement", "why"),
    [
        ({"actor": "0-3:0-1"}, "it holds 2 accelerators"),
        ({"actor": {"placement": "0-3", "isolate": False}}, "isolate: false"),
        ({"actor": {"node_group": "node", "placement": "0"}}, "holds no accelerator"),
    ],
)
def test_components_where_openrlhf_would_use_the_physical_id_are_refused(placement, why):
    noset = _openrlhf_noset()
    found = assignments(placement)
    assert all(noset(a.runtime_env_vars()) for a in found)  # OpenRLHF's own reading
    with pytest.raises(PlacementError, match=why) as e:
        training_layout("actor", found, 1)
    assert "one accelerator per process and isolate: true" in str(e.value)
    assert "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES" in str(e.value)


@pytest.mark.parametrize("bad", [0, 3, -2, True, 1.0, "2"])
def test_duplicate_actors_must_divide_the_world(bad):
    found = assignments({"actor": "0-3"})
    with pytest.raises(PlacementError, match="duplicate_actors") as e:
        training_layout("actor", found, bad)
    assert "\n" not in str(e.value)
    if isinstance(bad, int) and not isinstance(bad, bool):
        assert "allowed: 1, 2, 4" in str(e.value)


def test_engine_size_is_what_each_process_holds():
    engines = assignments({"rollout": {"placement": "0-7:0-3", "engine": "vllm"}}, "rollout")
    assert engine_layout("rollout", engines) == 2
    assert engine_layout("rollout", assignments({"rollout": "0-3"}, "rollout")) == 1


def test_engines_that_cannot_place_their_workers_are_refused():
    with pytest.raises(PlacementError, match="set engine: vllm on rollout"):
        engine_layout("rollout", assignments({"rollout": "0-7:0-3"}, "rollout"))
    with pytest.raises(PlacementError, match="holds no accelerator"):
        engine_layout(
            "rollout", assignments({"rollout": {"node_group": "node", "placement": "0"}}, "rollout")
        )
