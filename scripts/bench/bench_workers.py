#!/usr/bin/env python3
"""Worker-group launch time and assignment lookup latency, each beside its baseline.

On a local cluster of 2 nodes x 8 fake GPUs, in one run:

1. ``WorkerGroup.launch`` of 16 actors until every one answers, against hand-written
   Ray code creating the same 16 actors with the same options (computed beforehand,
   so the baseline pays nothing placectl-specific). Runs alternate.
2. The controller's ``assignments`` method with 1 caller and with 1,000 concurrent
   callers, against a no-op method of an async actor with the same concurrency.
3. The driver-side ``Reservation.assignments`` (one GCS read, planned locally) with a
   fresh reservation object each time.

Usage: scripts/bench/bench_workers.py [--repeat 5]
"""

from __future__ import annotations

import statistics
import time

import ray
from harness import Results, local_cluster, parser

import clients
from clients.launching import options_for

LAYOUT = {"num_nodes": 3, "component_placement": {"actor": "0-15"}}


class Worker:
    def ping(self) -> int:
        return 1


@ray.remote(num_cpus=0)
class NoOp:
    async def call(self, *args) -> None:
        return None


SUBMIT: dict[str, list[float]] = {"placectl": [], "hand": []}


def launch_placectl(res) -> float:
    t0 = time.perf_counter()
    group = clients.WorkerGroup.launch(res, "actor", Worker, wait=False)  # as by hand
    SUBMIT["placectl"].append(time.perf_counter() - t0)
    group.execute("ping")
    elapsed = time.perf_counter() - t0
    group.shutdown()
    return elapsed


def launch_by_hand(options: list[dict]) -> float:
    cls = ray.remote(Worker)
    t0 = time.perf_counter()
    actors = [cls.options(**o).remote() for o in options]
    SUBMIT["hand"].append(time.perf_counter() - t0)
    ray.get([a.ping.remote() for a in actors])
    elapsed = time.perf_counter() - t0
    for a in actors:
        ray.kill(a)
    return elapsed


def sequential(a, b, n: int = 300) -> tuple[list[float], list[float]]:
    """One caller: calls to ``a`` and ``b`` alternate, so both meet the same noise."""
    out: tuple[list[float], list[float]] = ([], [])
    for _ in range(n):
        for call, samples in ((a, out[0]), (b, out[1])):
            t0 = time.perf_counter()
            ray.get(call())
            samples.append(time.perf_counter() - t0)
    return out


def concurrent(a, b, n: int = 1000) -> tuple[list[float], list[float]]:
    """``n`` callers of each at once, submissions interleaved; each call's time from
    submission to completion."""
    started, kind, refs = {}, {}, []
    for _ in range(n):
        for which, call in ((0, a), (1, b)):
            ref = call()
            started[ref], kind[ref] = time.perf_counter(), which
            refs.append(ref)
    out: tuple[list[float], list[float]] = ([], [])
    pending = refs
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=30)
        now = time.perf_counter()
        for r in ready:
            out[kind[r]].append(now - started[r])
    ray.get(refs)
    return out


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[int(q * (len(s) - 1))] * 1000


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    results = Results("workers", args)
    with local_cluster(2, gpus=8, log_level="WARNING"):
        ctl = clients.connect()
        res = ctl.reserve("bench", LAYOUT, timeout_s=120, progress=lambda m: None)
        options = [options_for(a) for a in res.assignments("actor")]
        ours, theirs = [], []
        launch_by_hand(options)  # warm the worker pool for both sides
        for _ in range(args.repeat):
            ours.append(launch_placectl(res))
            theirs.append(launch_by_hand(options))
        t = results.add("hand-written Ray launch", theirs)["median"]
        o = results.add("WorkerGroup.launch", ours, baseline="hand-written Ray launch")["median"]
        print(f"launch 16 actors and wait for all, median of {args.repeat}:")
        print(f"  WorkerGroup.launch: {o:.3f} s  {[round(x, 3) for x in sorted(ours)]}")
        print(f"  hand-written Ray:   {t:.3f} s  {[round(x, 3) for x in sorted(theirs)]}")
        print(f"  ratio:              {o / t:.3f}")
        sp, sh = statistics.median(SUBMIT["placectl"]), statistics.median(SUBMIT["hand"][1:])
        print(f"  submitting 16 actors: placectl {1000 * sp:.1f} ms, by hand {1000 * sh:.1f} ms")
        results.add("submit by hand", SUBMIT["hand"][1:])
        results.add("submit WorkerGroup", SUBMIT["placectl"], baseline="submit by hand")

        handle, noop = ctl.handle, NoOp.options(max_concurrency=1000).remote()
        ray.get(noop.call.remote())

        def ours_call():
            return handle.assignments.remote("bench", "actor")

        def noop_call():
            return noop.call.remote("bench", "actor")

        print("controller assignments() vs a no-op async actor method (ms):")
        for label, runner in (("1 caller", sequential), ("1000+1000 concurrent", concurrent)):
            a, b = runner(ours_call, noop_call)
            results.add(f"no-op call, {label}", b)
            results.add(f"assignments call, {label}", a, baseline=f"no-op call, {label}")
            print(
                f"  {label:<16} assignments p50 {pct(a, 0.5):6.2f} p99 {pct(a, 0.99):6.2f} | "
                f"no-op p50 {pct(b, 0.5):6.2f} p99 {pct(b, 0.99):6.2f} | "
                f"p99 ratio {pct(a, 0.99) / pct(b, 0.99):.2f}"
            )
        local = []
        for _ in range(100):
            t0 = time.perf_counter()
            ctl.reservation("bench").assignments("actor")
            local.append(time.perf_counter() - t0)
        results.add("Reservation.assignments in the driver", local)
        print(
            f"  driver-side Reservation.assignments (GCS read + local plan), fresh object: "
            f"p50 {pct(local, 0.5):.2f} p99 {pct(local, 0.99):.2f}"
        )
        ctl.release_all()
    results.write()


if __name__ == "__main__":
    main()
