#!/usr/bin/env python3
"""Plan every real RLinf configuration with placectl and with RLinf's own placement code,
rank by rank, and print how they compare.

RLinf's code is read from a checkout given on the command line (never copied here) and
runs with import stand-ins for Ray and torch: placement is pure logic there too, apart
from the cluster it asks about, which this script builds the way RLinf's own placement
tests do (``num_nodes`` nodes of ``--gpus-per-node`` accelerators; hardware units from
each node group's ``hardware.configs``, as RLinf's enumeration would find them).

Compared for every process of every component: the node, the devices it sees, its
index and count on the node, the node's rank within the component, its hardware units.
Robot and node processes' own accelerator index is not compared: RLinf reports the
first device they see, placectl -1 (they hold none). Robot addresses that are
placeholders for the user to fill in (``robot_ip: ROBOT_IP``), which RLinf's config
check rejects, are replaced by TEST-NET addresses (192.0.2.x) on both sides first:
they say nothing about placement.

Usage: scripts/conformance/conformance_rlinf.py --rlinf PATH [--gpus-per-node 8] [--details]
Without --rlinf (or with a path that is not an RLinf checkout) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import glob
import importlib.abc
import importlib.machinery
import io
import logging
import os
import pathlib
import sys
import types
import warnings

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
STANDINS = ("ray", "torch", "icmplib", "pyrealsense2", "cv2")
CONFIG_DIRS = ("examples", "tests/e2e_tests", "evaluations")


# ------------------------------------------------------------------ import stand-ins
class _Anything(type):
    """A class that answers every attribute, call, subscript and operator with itself,
    except a call on one callable (a decorator), which returns that callable."""

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _thing(f"{cls.__name__}.{name}")

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return cls

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __iter__(cls):
        return iter(())


def _thing(name: str) -> type:
    return _Anything(name, (), {})


class _StandIn(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _thing(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in STANDINS:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandIn(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def load_rlinf(root: pathlib.Path) -> types.SimpleNamespace:
    """RLinf's placement code from ``root``, imported without running its package
    initialisers (which start workers and channels), Ray and torch stood in."""
    sys.meta_path.insert(0, _Finder())
    for name in ("rlinf", "rlinf.scheduler"):
        package = types.ModuleType(name)
        package.__path__ = [str(root / name.replace(".", "/"))]
        sys.modules[name] = package
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import rlinf.scheduler.hardware.robots  # noqa: F401  (registers the robot types)
        from rlinf.scheduler.cluster.config import ClusterConfig
        from rlinf.scheduler.cluster.node import NodeGroupInfo, NodeInfo
        from rlinf.scheduler.hardware import Accelerator, HardwareInfo, HardwareResource
        from rlinf.scheduler.placement.placement import ComponentPlacement
    return types.SimpleNamespace(
        ClusterConfig=ClusterConfig,
        NodeGroupInfo=NodeGroupInfo,
        NodeInfo=NodeInfo,
        Accelerator=Accelerator,
        HardwareInfo=HardwareInfo,
        HardwareResource=HardwareResource,
        ComponentPlacement=ComponentPlacement,
    )


# ------------------------------------------------------------------ RLinf's side
class _Cluster:
    """The cluster RLinf's placement asks about (the interface its tests stub)."""

    def __init__(self, nodes, groups):
        self._nodes, self._groups = nodes, groups

    def get_node_group(self, label=None):
        label = "cluster" if label is None else str(label)
        assert label in self._groups, f"Node group {label} not found"
        return self._groups[label]

    def get_node_info(self, node_rank):
        return self._nodes[node_rank]

    @property
    def num_nodes(self):
        return len(self._nodes)

    @property
    def num_accelerators(self):
        return sum(n.num_accelerators for n in self._nodes)


def rlinf_cluster(rl, cfg, gpus: int) -> _Cluster:
    from omegaconf import DictConfig

    cluster_cfg = rl.ClusterConfig.from_dict_cfg(DictConfig(cfg))
    nodes = []
    for rank in range(cluster_cfg.num_nodes):
        resources = [
            rl.HardwareResource(
                type=rl.Accelerator.HW_TYPE,
                infos=[
                    rl.HardwareInfo(type=rl.Accelerator.HW_TYPE, model="NV_GPU:Stand-in")
                    for _ in range(gpus)
                ],
            )
        ]
        by_type = collections.defaultdict(list)
        for hw in cluster_cfg.get_node_hw_configs_by_rank(rank):
            by_type[type(hw).__name__].append(hw)
        for group in cluster_cfg.node_groups or []:
            if group.hardware is not None and rank in group.node_ranks:
                units = [c for c in group.hardware.configs if c.node_rank == rank]
                resources.append(
                    rl.HardwareResource(
                        type=group.hardware.type,
                        infos=[
                            rl.HardwareInfo(type=group.hardware.type, model=group.hardware.type)
                            for _ in units
                        ],
                    )
                )
        nodes.append(
            rl.NodeInfo(
                node_labels=cluster_cfg.get_node_labels_by_rank(rank),
                node_rank=rank,
                ray_id=f"node-{rank}",
                node_ip=f"10.0.0.{rank + 1}",
                num_cpus=64,
                python_interpreter_path=sys.executable,
                default_env_vars={},
                env_vars={},
                hardware_resources=resources,
            )
        )
    groups = {}
    for g in cluster_cfg.node_groups or []:
        members = [n for n in nodes if n.node_rank in g.node_ranks]
        groups[g.label] = rl.NodeGroupInfo(
            label=g.label,
            nodes=members,
            hardware_type=g.hardware_type,
            env_configs=g.env_configs,
            ignore_hardware=g.ignore_hardware,
        )
    groups["cluster"] = rl.NodeGroupInfo(label="cluster", nodes=nodes)
    groups["node"] = rl.NodeGroupInfo(label="node", nodes=nodes, ignore_hardware=True)
    return _Cluster(nodes, groups)


def rlinf_plan(rl, cfg, gpus: int) -> dict[str, list[tuple]]:
    from omegaconf import DictConfig

    cluster = rlinf_cluster(rl, cfg, gpus)
    with contextlib.redirect_stderr(io.StringIO()):
        cp = rl.ComponentPlacement(DictConfig({"cluster": cfg}), cluster)
        out = {}
        for name in cp.components:
            placements = cp.get_strategy(name).get_placement(cluster, isolate_accelerator=True)
            out[name] = [
                (
                    p.cluster_node_rank,
                    [int(d) for d in p.visible_accelerators],
                    p.local_rank,
                    p.local_world_size,
                    p.placement_node_rank,
                    list(p.local_hardware_ranks),
                )
                for p in sorted(placements, key=lambda p: p.rank)
            ]
    return out


# ------------------------------------------------------------------ placectl's side
def placectl_plan(cfg, gpus: int) -> dict[str, list[tuple]]:
    from controller import ClusterView, ComponentPlacement, load_spec

    spec = load_spec(cfg)
    cp = ComponentPlacement(spec, ClusterView.uniform(spec.num_nodes, gpus))
    return {
        name: [
            (
                p.node_rank,
                list(p.cuda_visible_devices),
                p.local_rank,
                p.local_world_size,
                p.placement_node_rank,
                list(p.local_resource_ranks),
            )
            for p in cp.placements(name)
        ]
        for name in cp.components
    }


FIELDS = ("node", "devices", "local rank", "local world size", "node rank in component", "units")


def difference(theirs: dict, ours: dict) -> str:
    if list(theirs) != list(ours):
        return f"components {list(theirs)} vs {list(ours)}"
    for name in theirs:
        if len(theirs[name]) != len(ours[name]):
            return f"{name}: {len(theirs[name])} processes vs {len(ours[name])}"
        for rank, (a, b) in enumerate(zip(theirs[name], ours[name], strict=True)):
            for field, x, y in zip(FIELDS, a, b, strict=True):
                if x != y:
                    return f"{name}:{rank} {field}: RLinf {x}, placectl {y}"
    return ""


def fill_placeholder_ips(cfg: dict) -> dict:
    """Replace robot IP fields that are not IP addresses (placeholders) with TEST-NET
    addresses, so RLinf's config check looks at placement only."""
    import ipaddress

    n = 0
    for group in cfg.get("node_groups") or []:
        for entry in (group.get("hardware") or {}).get("configs") or []:
            for key, value in list(entry.items()):
                if key.endswith("robot_ip") and isinstance(value, str):
                    try:
                        ipaddress.ip_address(value)
                    except ValueError:
                        n += 1
                        entry[key] = f"192.0.2.{n}"
    return cfg


def configs(root: pathlib.Path) -> list[pathlib.Path]:
    import yaml

    out = []
    for d in CONFIG_DIRS:
        for path in sorted(glob.glob(str(root / d / "**" / "*.yaml"), recursive=True)):
            with contextlib.suppress(Exception):
                doc = yaml.safe_load(pathlib.Path(path).read_text())
                cluster = doc.get("cluster") if isinstance(doc, dict) else None
                if isinstance(cluster, dict) and "component_placement" in cluster:
                    out.append(pathlib.Path(path))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rlinf", help="path to a checkout of RLinf")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--details", action="store_true", help="list every file not identical")
    args = ap.parse_args()
    root = pathlib.Path(args.rlinf) if args.rlinf else None
    if root is None or not (root / "rlinf" / "scheduler" / "placement").is_dir():
        print(
            "conformance_rlinf: skipped: give --rlinf PATH, a checkout of RLinf "
            "(git clone https://github.com/RLinf/RLinf)"
        )
        return 0
    import yaml

    logging.disable(logging.WARNING)
    rl = load_rlinf(root)
    outcomes: dict[str, list[str]] = collections.defaultdict(list)
    for path in configs(root):
        rel = str(path.relative_to(root))
        cfg = fill_placeholder_ips(yaml.safe_load(path.read_text())["cluster"])
        try:
            theirs, their_error = rlinf_plan(rl, cfg, args.gpus_per_node), ""
        except Exception as e:
            theirs, their_error = None, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        try:
            ours, our_error = placectl_plan(cfg, args.gpus_per_node), ""
        except Exception as e:
            from controller import PlacementError

            kind = "placectl crashed" if not isinstance(e, PlacementError) else ""
            ours, our_error = None, f"{kind}{type(e).__name__}: {str(e)[:200]}"
        if theirs is not None and ours is not None:
            diff = difference(theirs, ours)
            outcomes[
                "both plan, every rank identical" if not diff else "both plan, ranks differ"
            ].append(rel + (f"  ({diff})" if diff else ""))
        elif theirs is not None:
            key = (
                "placectl crashed"
                if our_error.startswith("placectl crashed")
                else "placectl refuses, RLinf plans"
            )
            outcomes[key].append(f"{rel}  ({our_error})")
        elif ours is not None:
            outcomes["RLinf refuses, placectl plans"].append(f"{rel}  ({their_error})")
        else:
            outcomes["both refuse"].append(f"{rel}  (RLinf: {their_error}; placectl: {our_error})")
    total = sum(len(v) for v in outcomes.values())
    order = [
        "both plan, every rank identical",
        "both plan, ranks differ",
        "placectl refuses, RLinf plans",
        "RLinf refuses, placectl plans",
        "both refuse",
        "placectl crashed",
    ]
    print(
        f"RLinf configurations with a component_placement: {total} "
        f"({args.gpus_per_node} GPUs per node)"
    )
    print()
    print("| result | files |")
    print("|---|---|")
    for key in order:
        print(f"| {key} | {len(outcomes.get(key, []))} |")
    for key in order[1:]:
        if outcomes.get(key) and (args.details or key != "both refuse"):
            print(f"\n{key}:")
            for line in outcomes[key]:
                print(f"  {line}")
    return 1 if outcomes.get("placectl crashed") or outcomes.get("both plan, ranks differ") else 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    raise SystemExit(main())
