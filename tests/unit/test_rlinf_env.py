"""The worker environment against RLinf's own builder, without Ray.

RLinf 0.3.0's ``WorkerGroup._create_workers`` (the code that gives each RLinf worker
``RANK``, ``CLUSTER_NODE_RANK``, ``LOCAL_ACCELERATOR_RANK``, ``CUDA_VISIBLE_DEVICES``,
...) runs on a stand-in cluster for a few of RLinf's own cluster blocks, once on RLinf's
placements and once on placectl's plan; placectl's own environment is compared with
RLinf's on every variable both set. ``scripts/conformance/conformance_rlinf_env.py`` does this for
every configuration of an RLinf checkout; these blocks keep it in CI.
"""

from __future__ import annotations

import importlib.util
import pathlib

import pytest
import yaml

pytest.importorskip("rlinf.scheduler", reason="rlinf==0.3.0 is installed by scripts/test")

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "conformance_rlinf_env", ROOT / "scripts" / "conformance" / "conformance_rlinf_env.py"
)
env_conformance = importlib.util.module_from_spec(spec)
spec.loader.exec_module(env_conformance)

BLOCKS = {
    # RLinf's examples/embodiment/config/libero_spatial_dagger_openpi.yaml
    "libero dagger": yaml.safe_load(
        (ROOT / "tests" / "integration" / "data" / "rlinf_libero_dagger.yaml").read_text()
    )["cluster"],
    # examples/embodiment/config/maniskill_ppo_openvlaoft.yaml: colocated actor
    "maniskill ppo": {
        "num_nodes": 1,
        "component_placement": {"actor": "0-7", "env": "0-3", "rollout": "4-7"},
    },
    # evaluations/realworld/realworld_pnp_eval.yaml: a robot node group, env_configs added
    "realworld pnp": {
        "num_nodes": 2,
        "component_placement": {
            "env": {"node_group": "franka", "placement": 0},
            "rollout": {"node_group": "4090", "placement": 0},
        },
        "node_groups": [
            {"label": "4090", "node_ranks": 0},
            {
                "label": "franka",
                "node_ranks": 1,
                "hardware": {
                    "type": "Franka",
                    "configs": [{"robot_ip": "192.0.2.1", "node_rank": 1}],
                },
                "env_configs": [{"node_ranks": 1, "env_vars": [{"ROBOT_MODE": "sim"}]}],
            },
        ],
    },
}


@pytest.fixture(scope="module")
def rl():
    found = env_conformance.installed_rlinf()
    assert found is not None
    return found


@pytest.mark.parametrize("name", list(BLOCKS))
def test_rlinf_builds_the_same_environment_from_placectls_plan(rl, name):
    builder, own, known = env_conformance.compare(BLOCKS[name], rl, 8)
    assert builder == []
    assert own == []
    # the only differences: Ray's switch for isolated one-GPU processes (Ray sets the
    # same devices), and a robot process's accelerator index (it holds none)
    assert set(known) <= {
        "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES (placectl's env)",
        "LOCAL_ACCELERATOR_RANK",
        "LOCAL_ACCELERATOR_RANK (placectl's env)",
    }


def test_a_wrong_variable_is_caught(rl, monkeypatch):
    """The comparison fails when placectl's environment disagrees with RLinf's."""
    from controller.state import environment

    real = environment.worker_env

    def off_by_one(*args, **kwargs):
        env = real(*args, **kwargs)
        env["CLUSTER_NODE_RANK"] = str(int(env["CLUSTER_NODE_RANK"]) + 1)
        return env

    monkeypatch.setattr(environment, "worker_env", off_by_one)
    _, own, _ = env_conformance.compare(BLOCKS["maniskill ppo"], rl, 8)
    assert own and all("CLUSTER_NODE_RANK" in d for d in own)


def test_placectl_sets_every_placement_variable_rlinf_sets(rl):
    """Only the run's names, the accelerator's identity and NCCL/MuJoCo settings are
    RLinf's alone; a plain class on a reservation finds everything else."""
    rlinf_only, _ = env_conformance.only_keys(rl, 8)
    assert rlinf_only <= env_conformance.RLINF_ONLY, rlinf_only - env_conformance.RLINF_ONLY
