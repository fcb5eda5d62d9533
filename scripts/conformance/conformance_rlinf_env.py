#!/usr/bin/env python3
"""Build every RLinf worker's environment with RLinf's own code, for RLinf's placement and
for placectl's, and compare; then compare placectl's own worker environment with RLinf's.

For every real configuration under an RLinf checkout (the same files as
``conformance_rlinf.py``), RLinf's environment builder (``WorkerGroup._create_workers`` of
the installed ``rlinf==0.3.0``, the code that gives each RLinf worker ``RANK``,
``CLUSTER_NODE_RANK``, ``LOCAL_ACCELERATOR_RANK``, ``CUDA_VISIBLE_DEVICES``, ...) runs
without Ray, on a stand-in cluster that records what each worker would be started with:

1. fed RLinf's own placements (its ``ComponentPlacement``), and
2. fed placectl's plan of the same block, as RLinf ``Placement`` records;

every variable of every rank is compared. Then placectl's own worker environment
(``controller.state.environment.worker_env``, what a plain class on a reservation reads)
is compared with (1) on every variable both set, the node group's ``env_configs``
included. Known, deliberate differences are counted apart and explained in
docs/evidence/conformance.md.

Usage: scripts/conformance/conformance_rlinf_env.py --rlinf PATH [--gpus-per-node 8] [--details]
Without --rlinf, or without rlinf installed, it says so and exits 0.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import logging
import os
import pathlib
import sys
import types
import warnings

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import conformance_rlinf as conf  # noqa: E402  (the configs and RLinf's test cluster)

# placectl leaves Ray to set the visible devices of an isolated one-accelerator process
# (same devices, switch off); RLinf always sets them itself (switch on). A robot or node
# process holds no accelerator: placectl says -1, RLinf its first visible device.
KNOWN = {
    "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "Ray sets the devices (same ids)",
    "LOCAL_ACCELERATOR_RANK": "robot/node process: -1 (holds none)",
}
RUN_ONLY = {"GROUP_NAME", "WORKER_NAME"}  # names of the run, not of the placement
# What RLinf sets and placectl need not: names of the run and the RLinf cluster, the
# accelerator's identity, RLinf's accelerator-neutral copy of the devices, and settings
# for NCCL and MuJoCo. Any other RLinf variable missing from placectl's env is a failure.
RLINF_ONLY = RUN_ONLY | {
    "CLUSTER_NAMESPACE",
    "RAY_ACTOR",
    "CATCH_SYSTEM_FAILURE",
    "ACCELERATOR_TYPE",
    "ACCELERATOR_MODEL",
    "VISIBLE_DEVICES",
    "MUJOCO_EGL_DEVICE_ID",
    "NCCL_CUMEM_ENABLE",
    "TORCH_NCCL_AVOID_RECORD_STREAMS",
}


def installed_rlinf() -> types.SimpleNamespace | None:
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import rlinf.scheduler.hardware.robots  # noqa: F401
            from rlinf.scheduler.cluster.config import ClusterConfig
            from rlinf.scheduler.cluster.node import NodeGroupInfo, NodeInfo
            from rlinf.scheduler.hardware import Accelerator, HardwareInfo, HardwareResource
            from rlinf.scheduler.placement import ComponentPlacement
            from rlinf.scheduler.placement.placement import Placement
            from rlinf.scheduler.worker.worker_group import WorkerGroup
    except ImportError:
        return None
    return types.SimpleNamespace(
        ClusterConfig=ClusterConfig,
        NodeGroupInfo=NodeGroupInfo,
        NodeInfo=NodeInfo,
        Accelerator=Accelerator,
        HardwareInfo=HardwareInfo,
        HardwareResource=HardwareResource,
        ComponentPlacement=ComponentPlacement,
        Placement=Placement,
        WorkerGroup=WorkerGroup,
    )


class _Recorder(conf._Cluster):
    """RLinf's test cluster, answering what the environment builder asks and recording
    each ``allocate``: the node group's variables for the node, then RLinf's."""

    def __init__(self, base: conf._Cluster) -> None:
        super().__init__(base._nodes, base._groups)
        self.envs: dict[int, dict[str, str]] = {}

    def get_node_ip(self, node_rank: int) -> str:
        return self._nodes[node_rank].node_ip

    def allocate(self, *, worker_rank, node_rank, env_vars, node_group_label, **_rest):
        group = self.get_node_group(node_group_label).get_node_env_vars(node_rank)
        self.envs[worker_rank] = {**{k: str(v) for k, v in group.items()}, **env_vars}
        return object()


def rlinf_envs(rl, cluster: conf._Cluster, strategy, name: str) -> list[dict[str, str]]:
    """Run RLinf's ``WorkerGroup._create_workers`` on ``strategy`` without Ray."""
    recorder = _Recorder(cluster)
    group = types.SimpleNamespace(
        _placement_strategy=strategy,
        _cluster=recorder,
        _isolate_gpu=True,
        _worker_group_name=name,
        worker_group_name=name,
        _catch_system_failure=False,
        _max_concurrency=None,
        _worker_cls=None,
        _worker_cls_args=(),
        _worker_cls_kwargs={},
        _disable_distributed_log=True,
        _workers=[],
        _world_size=0,
    )
    rl.WorkerGroup._create_workers(group)
    return [recorder.envs[r] for r in sorted(recorder.envs)]


class _PlacectlStrategy:
    """placectl's plan of one component, handed to RLinf as its ``Placement`` records."""

    def __init__(self, rl, placements) -> None:
        self.rl, self.placements = rl, placements

    def get_placement(self, cluster, isolate_accelerator: bool = True):
        return [
            self.rl.Placement(
                rank=p.rank,
                cluster_node_rank=p.node_rank,
                placement_node_rank=p.placement_node_rank,
                local_accelerator_rank=p.local_gpu_id,
                accelerator_type=cluster.get_node_info(p.node_rank).accelerator_type,
                local_rank=p.local_rank,
                local_world_size=p.local_world_size,
                visible_accelerators=[str(d) for d in p.cuda_visible_devices],
                isolate_accelerator=p.isolate_gpu,
                local_hardware_ranks=list(p.local_resource_ranks),
                node_group_label=p.node_group,
            )
            for p in self.placements
        ]


def compare(cfg: dict, rl, gpus: int) -> tuple[list[str], list[str], collections.Counter]:
    """(differences between RLinf's builder on its plan and on placectl's, differences
    between RLinf's environment and placectl's own, known differences by variable)."""
    from omegaconf import DictConfig

    from controller import ClusterView, ComponentPlacement, load_spec
    from controller.state.environment import worker_env

    cluster = conf.rlinf_cluster(rl, cfg, gpus)
    spec = load_spec(cfg)
    ours = ComponentPlacement(spec, ClusterView.uniform(spec.num_nodes, gpus))
    with contextlib.redirect_stderr(io.StringIO()):
        theirs = rl.ComponentPlacement(DictConfig({"cluster": cfg}), cluster)
    builder, own, known = [], [], collections.Counter()
    for name in theirs.components:
        placements = ours.placements(name)
        by_rlinf = rlinf_envs(rl, cluster, theirs.get_strategy(name), name)
        by_plan = rlinf_envs(rl, cluster, _PlacectlStrategy(rl, placements), name)
        master = cluster.get_node_info(placements[0].node_rank).node_ip
        for rank, (a, b, p) in enumerate(zip(by_rlinf, by_plan, placements, strict=True)):
            for key in sorted(set(a) | set(b)):
                if a.get(key) != b.get(key):
                    if key in KNOWN and p.local_gpu_id < 0:
                        known[key] += 1
                    else:
                        builder.append(f"{name}:{rank} {key}: {a.get(key)!r} vs {b.get(key)!r}")
            env = worker_env(spec, "job", "uid", 0, p, master, None)
            for key in sorted((set(a) & set(env)) - RUN_ONLY):
                if a[key] != env[key]:
                    if key in KNOWN:
                        known[f"{key} (placectl's env)"] += 1
                    else:
                        own.append(f"{name}:{rank} {key}: RLinf {a[key]!r}, placectl {env[key]!r}")
    return builder, own, known


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rlinf", help="path to a checkout of RLinf (for its configurations)")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--details", action="store_true", help="list every difference")
    args = ap.parse_args()
    root = pathlib.Path(args.rlinf) if args.rlinf else None
    rl = installed_rlinf()
    if root is None or not (root / "examples").is_dir() or rl is None:
        print(
            "conformance_rlinf_env: skipped: needs rlinf installed (pip install --no-deps "
            "rlinf==0.3.0) and --rlinf PATH, a checkout of RLinf"
        )
        return 0
    import yaml

    logging.disable(logging.WARNING)
    files = collections.Counter()
    keys_only: dict[str, set[str]] = {"RLinf": set(), "placectl": set()}
    known_total: collections.Counter = collections.Counter()
    listed: list[str] = []
    for path in conf.configs(root):
        rel = str(path.relative_to(root))
        cfg = conf.fill_placeholder_ips(yaml.safe_load(path.read_text())["cluster"])
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                builder, own, known = compare(cfg, rl, args.gpus_per_node)
        except Exception as e:  # one side refuses: conformance_rlinf.py reports which
            files[f"not compared ({type(e).__name__})"] += 1
            listed.append(f"{rel}: not compared: {str(e).splitlines()[0][:160]}")
            continue
        known_total.update(known)
        files["builder: same environment for RLinf's plan and placectl's"] += not builder
        files["builder: environments differ"] += bool(builder)
        files["placectl's own environment agrees with RLinf's"] += not own
        files["placectl's own environment differs"] += bool(own)
        listed += [f"{rel}: {d}" for d in (builder + own)[: None if args.details else 3]]
    keys_only["RLinf"], keys_only["placectl"] = only_keys(rl, args.gpus_per_node)
    print(f"RLinf configurations compared ({args.gpus_per_node} GPUs per node):")
    print()
    print("| result | files |")
    print("|---|---|")
    for key, n in files.items():
        print(f"| {key} | {n} |")
    print()
    print("| known difference (processes) | count | why |")
    print("|---|---|---|")
    for key, n in sorted(known_total.items()):
        print(f"| {key} | {n} | {KNOWN[key.split(' ')[0]]} |")
    print()
    print("set by RLinf only:", ", ".join(sorted(keys_only["RLinf"])))
    print("set by placectl only:", ", ".join(sorted(keys_only["placectl"])))
    for line in listed:
        print("  " + line)
    missing = keys_only["RLinf"] - RLINF_ONLY
    if missing:
        print("RLinf sets, placectl does not:", ", ".join(sorted(missing)))
    bad = files["builder: environments differ"] + files["placectl's own environment differs"]
    return 1 if bad or missing else 0


def only_keys(rl, gpus: int) -> tuple[set[str], set[str]]:
    """The variables one side sets and the other never does, on a plain block."""
    from controller import ClusterView, ComponentPlacement, load_spec
    from controller.state.environment import worker_env

    cfg = {"num_nodes": 1, "component_placement": {"actor": "0-1"}}
    cluster = conf.rlinf_cluster(rl, cfg, gpus)
    from omegaconf import DictConfig

    theirs = rl.ComponentPlacement(DictConfig({"cluster": cfg}), cluster)
    a = rlinf_envs(rl, cluster, theirs.get_strategy("actor"), "actor")[0]
    spec = load_spec(cfg)
    p = ComponentPlacement(spec, ClusterView.uniform(1, gpus)).placements("actor")[0]
    b = worker_env(spec, "job", "uid", 0, p, "10.0.0.1", 29500)
    return set(a) - set(b), set(b) - set(a)


if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    raise SystemExit(main())
