#!/usr/bin/env python3
"""Growing a running job: apply + sync against release + reserve + relaunch, side by side.

A local cluster (a head and four raylets with 4 fake GPUs each) runs a colocated layout
(``actor,rollout``) on 8 GPUs with 8 actor workers; the job then grows to 16 GPUs and 16
workers, in alternating trials:

* ``apply``: ``ctl.apply`` with the new placement, then ``WorkerGroup.sync()``;
* ``baseline``: what a framework without elastic reservations does: release, reserve the
  new layout, launch every worker again.

Each is timed from the decision to grow to every worker of the grown group answering,
and counts the workers of the first 8 ranks that were restarted (their actor ids).

Usage: scripts/bench/bench_apply.py [--trials 3]
"""

from __future__ import annotations

import time

import ray
from harness import Results, local_cluster, parser

import clients

GPUS, NODES = 4, 4
SMALL = {"num_nodes": 1 + NODES, "component_placement": {"actor,rollout": "0-7"}}
LARGE = {"num_nodes": 1 + NODES, "component_placement": {"actor,rollout": "0-15"}}


APPLY_PART: list[float] = []  # of the apply path, the apply call alone


class Worker:
    def actor_id(self):
        return ray.get_runtime_context().get_actor_id()


def start(ctl):
    res = ctl.reserve("bench-apply", SMALL, timeout_s=300)
    group = clients.WorkerGroup.launch(res, "actor", Worker, progress=lambda m: None)
    return group, group.execute("actor_id")


def grown(ctl, group, ids: list[str], began: float) -> tuple[float, int]:
    """Time until all 16 workers answer, and how many of the first 8 are new processes."""
    now = group.execute("actor_id")
    took = time.perf_counter() - began
    assert len(now) == 16
    restarted = sum(a != b for a, b in zip(ids, now[:8], strict=True))
    group.shutdown()
    ctl.release("bench-apply")
    return took, restarted


def by_apply(ctl) -> tuple[float, int]:
    group, ids = start(ctl)
    began = time.perf_counter()
    ctl.apply("bench-apply", LARGE, progress=lambda m: None)
    APPLY_PART.append(time.perf_counter() - began)
    group.sync()
    return grown(ctl, group, ids, began)


def by_release_and_reserve(ctl) -> tuple[float, int]:
    group, ids = start(ctl)
    began = time.perf_counter()
    group.shutdown()
    ctl.release("bench-apply")
    res = ctl.reserve("bench-apply", LARGE, timeout_s=300, progress=lambda m: None)
    group = clients.WorkerGroup.launch(res, "actor", Worker, progress=lambda m: None)
    return grown(ctl, group, ids, began)


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()
    results = Results("apply", args)
    samples: dict[str, list[tuple[float, int]]] = {"apply": [], "baseline": []}
    with local_cluster(NODES, gpus=GPUS, cpus=GPUS * 2, log_level="ERROR"):
        ctl = clients.connect()
        print(f"{NODES} nodes x {GPUS} fake GPUs; actor,rollout 0-7 -> 0-15 with 8 -> 16 workers")
        try:
            for t in range(args.trials):
                order = ("apply", "baseline") if t % 2 == 0 else ("baseline", "apply")
                for name in order:
                    fn = by_apply if name == "apply" else by_release_and_reserve
                    samples[name].append(fn(ctl))
                print(
                    f"  trial {t + 1}: apply {samples['apply'][-1][0]:.2f} s, "
                    f"release+reserve+relaunch {samples['baseline'][-1][0]:.2f} s"
                )
        finally:
            ctl.release_all()
    for label, name in (
        ("release + reserve + relaunch", "baseline"),
        ("apply + sync", "apply"),
    ):
        times = [s for s, _ in samples[name]]
        restarts = max(r for _, r in samples[name])
        m = results.add(
            name, times, baseline=None if name == "baseline" else "baseline", restarted=restarts
        )
        print(
            f"  {label:<30} median {m['median']:6.2f} s ({m.get('ratio', 1.0):.2f}x)  "
            f"unchanged workers restarted: {restarts} of 8   "
            f"samples {' '.join(f'{x:.2f}' for x in times)}"
        )
    part = results.add("apply call", APPLY_PART)
    print(f"  of which the apply call: median {part['median']:.2f} s")
    results.write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
