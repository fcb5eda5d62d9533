#!/usr/bin/env python3
"""The queue at scale, on the in-memory fake cluster: 1,000 nodes x 8 GPUs, all held by
125 eight-node jobs, and 1,000 reservations queued behind them (each wants the nodes of
one holder, priorities 0-9). Measured, in one run:

* one admission decision after a release: placectl's own time in the pass (no Ray call
  in it; Ray's "free resources" read is modelled by the fake) with each entry's plan
  kept from the last pass, beside the same pass re-planning every entry (what an
  admission loop without that cache would do);
* the time from a release to the groups of the reservation it admitted being requested
  from Ray (the controller's loop is woken by the release, decides, and starts placing);
* the time to queue 1,000 reservations (each is planned once, to refuse at once what
  could never fit).

Usage: scripts/bench/bench_queue.py [--nodes 1000] [--queued 1000] [--releases 5]
"""

from __future__ import annotations

import asyncio
import pathlib
import random
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench_control_plane import RAY, QuietCluster, controller_on, job_spec
from harness import Results, parser

GPUS = 8


class Timed(QuietCluster):
    """Records when each group was first asked for, by the job in its name."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.asked: dict[str, float] = {}

    async def create_group(self, name, bundles, node_id):
        job = name.split(":")[2]
        self.asked.setdefault(job, time.perf_counter())
        return await super().create_group(name, bundles, node_id)


async def run(nodes: int, queued: int, releases: int) -> dict:
    fake = Timed(latency=RAY)
    ctl = await controller_on(fake, nodes)
    total, holders = nodes + 1, nodes // 8
    for h in range(holders):
        await ctl.reserve(f"h{h}", job_spec(1 + 8 * h, 8, total), 3600)
    rng = random.Random(0)
    started = time.perf_counter()
    waiting = [
        asyncio.create_task(
            ctl.reserve(
                f"q{i}",
                job_spec(1 + 8 * (i % holders), 8, total),
                3600,
                queue="bench",
                priority=rng.randrange(10),
            )
        )
        for i in range(queued)
    ]
    while sum(r.state == "queued" for r in ctl.state.records.values()) < queued:
        await asyncio.sleep(0.01)
    out = {"enqueue_s": time.perf_counter() - started}
    admitter = ctl.ops.admitter
    decision = await admitter.admit()
    assert not decision.admitted and len(decision.waiting) == queued
    cached, replanned, to_request = [], [], []
    for h in range(releases):
        admitter.forget_plans()  # the baseline: every entry planned again
        await admitter.admit()
        replanned.append(admitter.last_pass_s)
        await admitter.admit()  # warm again
        fake.asked.clear()
        t0 = time.perf_counter()
        await ctl.release(f"h{h}")
        while not fake.asked:
            await asyncio.sleep(0.0005)
        to_request.append(min(fake.asked.values()) - t0)
        cached.append(admitter.last_pass_s)
        job = next(iter(fake.asked))
        while ctl.state.get(job).state != "ready":
            await asyncio.sleep(0.001)
    out.update(decision_cached=cached, decision_replanned=replanned, release_to_request=to_request)
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    await ctl.stop()
    return out


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--queued", type=int, default=1000)
    ap.add_argument("--releases", type=int, default=5)
    args = ap.parse_args()
    out = asyncio.run(run(args.nodes, args.queued, args.releases))
    results = Results("queue", args)
    results.add("enqueue all", [out["enqueue_s"]])
    results.add("decision, re-planning every entry", out["decision_replanned"])
    results.add(
        "decision, plans kept", out["decision_cached"], baseline="decision, re-planning every entry"
    )
    results.add("release to next request", out["release_to_request"])

    def ms(values):
        return f"{1000 * statistics.median(values):.2f} ({1000 * max(values):.2f})"

    print(f"{args.nodes} nodes x {GPUS} GPUs, {args.queued} queued, {args.releases} releases")
    print(f"queueing {args.queued} reservations: {out['enqueue_s']:.2f} s")
    print("median (max) ms:")
    print(f"  admission decision after a release, plans kept: {ms(out['decision_cached'])}")
    print(f"  the same decision re-planning every entry:      {ms(out['decision_replanned'])}")
    print(f"  release -> next job's groups requested:         {ms(out['release_to_request'])}")
    results.write()


if __name__ == "__main__":
    main()
