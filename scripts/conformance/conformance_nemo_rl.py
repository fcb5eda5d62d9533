#!/usr/bin/env python3
"""Order the same topologies with NeMo-RL's own topology sort and with placectl's node
order, and print where they agree.

NeMo-RL (``nemo_rl/distributed/virtual_cluster.py``) orders a placement group's bundles by
NVLink domain and topology rank (``_sort_bundle_indices_by_topology``), reading each
node's ``nvlink_domain_<ClusterUUID>`` and ``topo_rank`` resources. Its code is read from a
checkout given on the command line (never copied here) and runs with Ray stood in for.
Each case is a cluster of nodes with a domain and a topology rank (or none); NeMo-RL's
order of one-GPU bundles is compared with placectl's node order of the same nodes
(``order_nodes``, the nodes carrying NeMo-RL's resources), GPU by GPU.

Usage: scripts/conformance/conformance_nemo_rl.py --nemo-rl PATH
Without --nemo-rl (or with a path that is not a NeMo-RL checkout) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import pathlib
import random
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import conformance_rlinf as standins  # noqa: E402  (import stand-ins for Ray)

from controller.planning.cluster import NodeView, order_nodes  # noqa: E402

GPUS = 4


def load_nemo_rl(root: pathlib.Path):
    sys.meta_path.insert(0, standins._Finder())
    path = root / "nemo_rl" / "distributed" / "virtual_cluster.py"
    spec = importlib.util.spec_from_file_location("_nemo_rl_virtual_cluster", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _node(i: int, domain: str | None, topo: int | None, ip: str) -> NodeView:
    resources: dict[str, float] = {}
    if domain is not None:
        resources[f"nvlink_domain_{domain}"] = 1.0
    if topo is not None:
        resources["topo_rank"] = float(topo)
    return NodeView(num_gpus=GPUS, node_id=f"n{i:03d}", ip=ip, resources=resources)


def cases() -> dict[str, list[NodeView]]:
    rng = random.Random(7)
    out = {}
    # two NVL72-style domains of 18 nodes, topology ranks unique, IPs shuffled
    ips = [f"10.0.{i // 200}.{i % 200 + 1}" for i in range(64)]
    rng.shuffle(ips)
    nodes = [_node(i, "A" if i % 2 else "B", 100 - i, ips[i]) for i in range(36)]
    out["2 domains x 18, unique topology ranks"] = nodes
    # three domains whose names sort against their topology order
    out["3 domains, names against topology order"] = [
        _node(i, ["x", "m", "a"][i // 6], 3 * (i // 6) + (5 - i % 6), ips[i]) for i in range(18)
    ]
    # a domain and 4 nodes that state a topology rank but no domain
    out["domain plus nodes without one"] = [_node(i, "D", 10 + i, ips[i]) for i in range(8)] + [
        _node(8 + i, None, 1 + i, ips[8 + i]) for i in range(4)
    ]
    # domains without topology ranks
    out["domains, no topology ranks"] = [_node(i, "AB"[i % 2], None, ips[i]) for i in range(8)]
    return out


def nemo_order(vc, nodes: list[NodeView]) -> list[tuple[str, int]]:
    bundles = []
    for n in nodes:
        domain = next(
            (k for k in n.resources if k.startswith(vc.NVLINK_DOMAIN_PREFIX)),
            vc.NVLINK_DOMAIN_UNKNOWN,
        )
        topo = int(n.resources.get(vc.TOPO_RANK_KEY, vc.TOPO_RANK_UNKNOWN))
        for gpu in range(n.num_gpus):
            bundles.append((gpu, domain, topo, n.node_id))
    order = vc._sort_bundle_indices_by_topology(bundles)
    return [(bundles[i][3], bundles[i][0]) for i in order]


def placectl_order(nodes: list[NodeView]) -> list[tuple[str, int]]:
    return [(n.node_id, g) for n in order_nodes(nodes) for g in range(n.num_gpus)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nemo-rl", help="path to a checkout of NeMo-RL")
    args = ap.parse_args()
    root = pathlib.Path(args.nemo_rl) if args.nemo_rl else None
    if root is None or not (root / "nemo_rl" / "distributed" / "virtual_cluster.py").is_file():
        print(
            "conformance_nemo_rl: skipped: give --nemo-rl PATH, a checkout of NeMo-RL "
            "(git clone https://github.com/NVIDIA-NeMo/RL)"
        )
        return 0
    logging.disable(logging.INFO)
    vc = load_nemo_rl(root)
    print("| case | nodes | GPUs | same order | first difference (NeMo-RL vs placectl) |")
    print("|---|---|---|---|---|")
    for name, nodes in cases().items():
        theirs, ours = nemo_order(vc, nodes), placectl_order(nodes)
        pairs = enumerate(zip(theirs, ours, strict=True))
        diff = next(
            (f"GPU {i}: {a[0]}:{a[1]} vs {b[0]}:{b[1]}" for i, (a, b) in pairs if a != b), ""
        )
        same = "yes" if not diff else "no"
        print(f"| {name} | {len(nodes)} | {len(ours)} | {same} | {diff or '-'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
