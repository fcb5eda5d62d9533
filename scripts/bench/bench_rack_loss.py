#!/usr/bin/env python3
"""A rack lost under many jobs: every job repaired, beside one job's repair alone.

* **Fake cluster** (default): ``--nodes`` GPU nodes of 8 GPUs in racks of 8, ``--jobs``
  jobs of 2 GPUs on the first rack, the rack killed at once; Ray's own latencies spent
  for real (``clients.testing.rack_loss``: the GCS schedules one group at a time, then
  the group is placed; a probe, one at a time per node; the figures ``--real`` measures).
  Each repair runs in its own job's steward, its spare claimed, not locked.
* **A real local cluster** (``--real``): a head and 6 nodes of 4 fake GPUs; 4 jobs of 2
  GPUs on 2 nodes (the "rack"), both removed abruptly at once (every process killed), and
  the time until every job is ready again on other nodes, beside one job on one node
  lost alone. It first measures Ray's costs the fake models: 8 pinned groups made at
  once, and a warm probe. Run it from a checkout of any placectl commit to compare.

The last line: ``rack loss: <jobs> jobs repaired in <ms> ms, one job alone <ms> ms,
ratio <r>`` (the fake's). Usage: scripts/bench/bench_rack_loss.py [--nodes 1000]
[--jobs 32] [--trials 3] [--real] [--json PATH]; ``--trials 0 --real`` runs the real
cluster alone (from an older checkout, whose fake has no such scenario).
"""

from __future__ import annotations

import asyncio
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from harness import Results, local_cluster, parser


def fake(nodes: int, jobs: int, trials: int, res: Results) -> tuple[float, float]:
    from clients.testing.rack_loss import rack_loss

    alone, rack = [], []
    for _ in range(trials):
        alone.append(asyncio.run(rack_loss(jobs=1, nodes=nodes))["seconds"])
        rack.append(asyncio.run(rack_loss(jobs=jobs, nodes=nodes))["seconds"])
        print(f"  fake: one job {alone[-1] * 1000:.0f} ms, {jobs} jobs {rack[-1] * 1000:.0f} ms")
    res.add("fake: one job's repair alone", alone)
    res.add(f"fake: a rack under {jobs} jobs, every one repaired", rack,
            baseline="fake: one job's repair alone")  # fmt: skip
    return statistics.median(rack), statistics.median(alone)


def _costs() -> dict:
    """Ray's costs on this machine: 8 groups pinned to 2 nodes made at once (until all
    placed), one alone, and a probe task in a bundle once its worker is warm."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")]

    def make(k: int) -> float:
        started = time.perf_counter()
        pgs = [
            placement_group([{"GPU": 0.1}], bundle_label_selector=[{"ray.io/node-id": n}])
            for n in (nodes * k)[:k]
        ]
        ray.get([pg.ready() for pg in pgs], timeout=60)
        took = time.perf_counter() - started
        for pg in pgs:
            remove_placement_group(pg)
        return took

    one, eight = min(make(1) for _ in range(3)), min(make(8) for _ in range(3))
    pg = placement_group([{"GPU": 0.1}], bundle_label_selector=[{"ray.io/node-id": nodes[0]}])
    ray.get(pg.ready(), timeout=60)

    @ray.remote(num_cpus=0, num_gpus=0.0001, max_calls=0)
    def probe() -> int:
        return 0

    opts = {"scheduling_strategy": PlacementGroupSchedulingStrategy(pg, 0)}
    ray.get(probe.options(**opts).remote())  # warm
    started = time.perf_counter()
    for _ in range(10):
        ray.get(probe.options(**opts).remote())
    per_probe = (time.perf_counter() - started) / 10
    remove_placement_group(pg)
    return {"group_alone": one, "groups_8_at_once": eight, "probe": per_probe}


def _lose(cluster, ctl, victims, jobs: list[str]) -> tuple[float, float]:
    """Kill ``victims`` abruptly at once; seconds until Ray's node table calls every one
    dead, and until every job is ready again."""
    import ray

    from clients.testing import machines

    started = time.monotonic()
    for node in victims:
        machines.crash(cluster, node)
    ids, noticed = {n.node_id for n in victims}, None
    for job in jobs:
        while ctl.status(job).state != "ready" or ctl.status(job).epoch < 2:
            if noticed is None and not any(n["Alive"] for n in ray.nodes() if n["NodeID"] in ids):
                noticed = time.monotonic() - started
            if time.monotonic() - started > 120:
                raise TimeoutError(f"{job} was not repaired within 120 s")
            time.sleep(0.02)
    took = time.monotonic() - started
    return (took if noticed is None else noticed), took


def real(res: Results) -> None:
    import clients

    def spec(node_rank: int, first: int) -> dict:
        return {
            "num_nodes": 7,
            "node_groups": [{"label": "mine", "node_ranks": str(node_rank)}],
            "component_placement": {
                "actor": {"node_group": "mine", "placement": f"{first}-{first + 1}"}
            },
        }

    for trial in ("one job alone", "a rack of 2 nodes under 4 jobs"):
        with local_cluster(gpu_nodes=6, gpus=4) as (cluster, nodes):
            ctl = clients.connect(address="auto")
            if trial == "one job alone":
                costs = _costs()
                print(f"  real: Ray's costs here: {costs}")
                for name, v in costs.items():
                    res.add(f"real: Ray {name}", [v])
            jobs = ["a"] if trial == "one job alone" else ["a", "b", "c", "d"]
            where = [(1, 0), (1, 2), (2, 0), (2, 2)]  # (node rank, first GPU)
            for job, (rank, first) in zip(jobs, where, strict=False):
                ctl.reserve(job, spec(rank, first), timeout_s=120)
            victims = {ctl.status(j).slots[0].node_id for j in jobs}
            noticed, took = _lose(cluster, ctl, [n for n in nodes if n.node_id in victims], jobs)
            print(
                f"  real: {trial}: Ray's table says dead {noticed:.2f} s, every job ready "
                f"again {took:.2f} s after the loss"
            )
            res.add(f"real: {trial}", [took])
            res.add(f"real: {trial}: Ray's notice of the death", [noticed])
            ctl.release_all()


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=32)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--real", action="store_true", help="also on a real local cluster")
    args = ap.parse_args()
    res = Results("bench_rack_loss", args)
    if args.real:
        real(res)
    if not args.trials:  # --real alone: what an older checkout without the fake runs
        res.write()
        return
    rack, alone = fake(args.nodes, args.jobs, args.trials, res)
    res.write()
    print(
        f"rack loss: {args.jobs} jobs repaired in {rack * 1000:.0f} ms, one job alone "
        f"{alone * 1000:.0f} ms, ratio {rack / alone:.2f}"
    )


if __name__ == "__main__":
    main()
