"""The planning figure the docs state, guarded: 26,624 placements (four components on
1024 nodes x 8 GPUs, as ``scripts/bench/bench_plan.py`` plans them) in 0.118 s, against a
target of 0.2 s. Bounded for 2 loaded cores, where a regression of several times (a
search per process, as the naive planner does) still fails. The other figures' bounds
and the figures that are the benchmarks' alone: docs/evidence/benchmarks.md."""

from __future__ import annotations

import statistics
import time

from controller import ClusterView, ComponentPlacement

NODES, GPUS = 1024, 8
PLACEMENTS = 26_624
PLAN_S = 1.0


def test_planning_26624_placements_stays_near_its_figure():
    g = NODES * GPUS
    conf = {
        "num_nodes": NODES,
        "component_placement": {
            "actor,rollout": "all",
            "inference": f"0-{g // 2 - 1}:0-{g - 1}",
            "reward": f"{g // 2}-{g - 1}:0-{g // 4 - 1}",
        },
    }
    view = ClusterView.uniform(NODES, GPUS)
    took = []
    for _ in range(3):
        started = time.perf_counter()
        plan = ComponentPlacement(conf, view)
        placed = sum(len(plan.placements(c)) for c in ("actor", "rollout", "inference", "reward"))
        took.append(time.perf_counter() - started)
    assert placed == PLACEMENTS
    assert statistics.median(took) < PLAN_S, took
