#!/usr/bin/env python3
"""Planning time for large clusters, placectl against a naive planner, in one run.

Four components on N nodes x 8 GPUs (G = 8N accelerators):
    actor,rollout: all          inference: 0-{G/2-1}:0-{G-1}        reward: {G/2}-{G-1}:0-{G/4-1}
That is 3.25 G placements (26,624 at 1024 nodes), all four colocated on the first half.

The baseline is a straightforward planner written for this benchmark: it expands the same
strings, then finds each process's node, local rank and node order by scanning what it
has placed so far, the per-process searches that make common implementations grow
quadratically. It checks nothing and computes no shares, so it is a lower bound for such
an implementation. Sizes where it would take minutes are skipped.

With ``--domains`` it also plans the same configuration on nodes in NVLink domains of 8
(64 GPUs each, stated by Ray's ``ray.io/gpu-domain`` label, listed in shuffled order), the
``actor,rollout`` segments of 64 checked to stay within one domain: node order plus
planning, beside the same plan without topology, in one run.

Usage: scripts/bench/bench_plan.py [--repeat 5] [--nodes 128 256 512 1024] [--baseline-max 512]
       [--domains 1024 10000]
"""

from __future__ import annotations

import random
import statistics
import time

from harness import Results, parser

from controller import ClusterView, ComponentPlacement, NodeView
from controller.planning.cluster import order_nodes


def config(nodes: int, gpus: int = 8) -> dict:
    g = nodes * gpus
    return {
        "num_nodes": nodes,
        "component_placement": {
            "actor,rollout": "all",
            "inference": f"0-{g // 2 - 1}:0-{g - 1}",
            "reward": f"{g // 2}-{g - 1}:0-{g // 4 - 1}",
        },
    }


def naive_plan(conf: dict, gpus_per_node: int) -> dict[str, list[dict]]:
    nodes = conf["num_nodes"]
    total = nodes * gpus_per_node
    out = {}
    for key, text in conf["component_placement"].items():
        procs: list[list[int]] = []
        for seg in text.split(","):
            res, _, pr = seg.partition(":")
            lo, hi = (0, total - 1) if res == "all" else map(int, res.split("-"))
            n_res = hi - lo + 1
            plo, phi = map(int, pr.split("-")) if pr else (len(procs), len(procs) + n_res - 1)
            n_proc = phi - plo + 1
            for j in range(n_proc):
                if n_proc >= n_res:
                    procs.append([lo + j // (n_proc // n_res)])
                else:
                    k = n_res // n_proc
                    procs.append(list(range(lo + j * k, lo + j * k + k)))
        placements: list[dict] = []
        for rank, res in enumerate(procs):
            node = next(n for n in range(nodes) if res[0] < (n + 1) * gpus_per_node)
            local_rank = sum(1 for p in placements if p["node_rank"] == node)
            node_order = []
            for p in placements:
                if p["node_rank"] not in node_order:
                    node_order.append(p["node_rank"])
            placement_node_rank = node_order.index(node) if node in node_order else len(node_order)
            placements.append(
                {
                    "rank": rank,
                    "node_rank": node,
                    "local_rank": local_rank,
                    "placement_node_rank": placement_node_rank,
                    "cuda_visible_devices": [r % gpus_per_node for r in res],
                }
            )
        for name in key.split(","):
            out[name] = placements
    return out


def domain_nodes(nodes: int, per_domain: int = 8) -> list[NodeView]:
    """``nodes`` 8-GPU nodes in NVLink domains of ``per_domain``, in shuffled order."""
    out = [
        NodeView(
            num_gpus=8,
            node_id=f"{i:056x}",
            ip=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
            labels={"ray.io/gpu-domain": f"d{i // per_domain:05d}"},
        )
        for i in range(nodes)
    ]
    random.Random(1).shuffle(out)
    return out


def with_segments(nodes: int) -> dict:
    conf = config(nodes)
    placement = conf["component_placement"]
    placement["actor,rollout"] = {"placement": "all", "topology": {"segment": 64}}
    return conf


def bench_domains(sizes: list[int], repeat: int, results: Results) -> None:
    print()
    print(
        f"{'nodes x 8':>10} {'placements':>11} {'plain (s)':>10} {'order (s)':>10} "
        f"{'plan+check (s)':>15} {'ratio':>6}"
    )
    for nodes in sizes:
        listed = domain_nodes(nodes)
        view = ClusterView(nodes=order_nodes(listed))
        conf, plain_conf = with_segments(nodes), config(nodes)
        plain_view = ClusterView.uniform(nodes, 8)
        count = sum(ComponentPlacement(conf, view).world_size(c) for c in ("actor", "rollout"))
        count += ComponentPlacement(plain_conf, plain_view).world_size("inference")
        count += ComponentPlacement(plain_conf, plain_view).world_size("reward")
        plain = timed(
            lambda c=plain_conf, v=plain_view: ComponentPlacement(c, v),
            repeat,
            results,
            f"plan without domains @{nodes}",
        )
        order = timed(lambda nodes=listed: order_nodes(nodes), repeat, results, f"order @{nodes}")
        planned = timed(
            lambda c=conf, v=view: ComponentPlacement(c, v),
            repeat,
            results,
            f"plan with segments @{nodes}",
        )
        print(
            f"{nodes:>10} {count:>11,} {plain:>10.3f} {order:>10.3f} {planned:>15.3f} "
            f"{(order + planned) / plain:>5.2f}x"
        )


def timed(fn, repeat: int, results: Results | None = None, name: str = "") -> float:
    """The median of ``repeat`` runs of ``fn``, the samples recorded as ``name``."""
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    if results is not None:
        results.add(name, samples)
    return statistics.median(samples)


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--nodes", type=int, nargs="+", default=[128, 256, 512, 1024])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--baseline-max", type=int, default=256, help="largest size for the baseline")
    ap.add_argument("--domains", type=int, nargs="*", default=[], help="sizes with NVLink domains")
    args = ap.parse_args()
    results = Results("plan", args)
    print(
        f"{'nodes x 8':>10} {'placements':>11} {'placectl (s)':>13} {'us/placement':>12} "
        f"{'naive (s)':>10} {'speed-up':>9}"
    )
    for nodes in args.nodes:
        conf = config(nodes)
        view = ClusterView.uniform(nodes, 8)
        cp = ComponentPlacement(conf, view)
        count = sum(cp.world_size(c) for c in cp.components)
        ours = timed(
            lambda conf=conf, view=view: ComponentPlacement(conf, view),
            args.repeat,
            results,
            f"placectl @{nodes}",
        )
        if nodes <= args.baseline_max:
            # timed as placectl is: the median of the same number of runs
            base = timed(
                lambda conf=conf: naive_plan(conf, 8), args.repeat, results, f"naive @{nodes}"
            )
            # same placements, so the comparison is of like with like
            naive = naive_plan(conf, 8)
            for name in cp.components:
                got = [
                    (p.node_rank, p.local_rank, p.cuda_visible_devices) for p in cp.placements(name)
                ]
                want = [
                    (p["node_rank"], p["local_rank"], p["cuda_visible_devices"])
                    for p in naive[name]
                ]
                if got != want:
                    raise SystemExit(f"baseline disagrees with placectl on {name} at {nodes} nodes")
            base_s, ratio = f"{base:10.2f}", f"{base / ours:8.0f}x"
        else:
            base_s, ratio = f"{'skipped':>10}", f"{'-':>9}"
        print(
            f"{nodes:>10} {count:>11,} {ours:>13.3f} {1000 * ours / count * 1000:>12.2f} "
            f"{base_s} {ratio}"
        )
    if args.domains:
        bench_domains(args.domains, args.repeat, results)
    results.write()


if __name__ == "__main__":
    main()
