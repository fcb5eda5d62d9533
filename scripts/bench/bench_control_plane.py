#!/usr/bin/env python3
"""The control plane at scale, on the in-memory fake cluster, with a real-cluster row.

The fake answers with Ray's costs as parameters (GCS round trip, group creation rate,
placement, probe, per-node cost of whole-cluster reads) and adds them up instead of
sleeping, so each figure separates placectl's own cost (wall time; the fake itself
sleeps never) from Ray's (modelled). For each cluster size (nodes x 8 GPUs) the cluster
is filled with 8-node jobs, plus one big job (128 nodes where it fits), every job
colocating actor and rollout on all GPUs of its nodes. Measured:

* reserve and release of the big job and of an 8-node job;
* bytes written to the GCS per mutation (a reserve, a state change);
* a reconcile tick: quiet, after one node's death, and the full safety-net check;
* repair of one lost node of the big job;
* a driver's attach and assignments() of the big job, from the stored table.

Usage: scripts/bench/bench_control_plane.py [--sizes 100,1000,4000] [--real 8]
"""

from __future__ import annotations

import asyncio
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from harness import Results, local_cluster, parser

from clients.testing.fake_cluster import FakeCluster, Latency
from clients.testing.fake_table import DriverTable
from controller.runtime.controller import PlacementController
from controller.runtime.core.settings import Settings

GPUS = 8
RAY = Latency(
    gcs_rtt=0.002,  # one GCS key-value or table round trip
    group_create=0.05,  # Ray's many_pgs: about 20 groups/s, one at a time
    group_place=0.01,
    probe=0.005,
    per_node_read=0.00002,  # per node in a whole-cluster read (nodes, groups)
)
QUIET = Settings(reconcile_period=3600.0, full_check_period=3600.0, warm_budget=0)


class QuietCluster(FakeCluster):
    """The fake, except that node events do not wake the controller's loop: the
    benchmark runs every tick itself, so that it can time them."""

    async def wait_for_events(self, timeout: float) -> None:
        await asyncio.sleep(timeout)


def job_spec(first: int, count: int, num_nodes: int) -> dict:
    return {
        "num_nodes": num_nodes,
        "node_groups": [{"label": "mine", "node_ranks": f"{first}-{first + count - 1}"}],
        "component_placement": {"actor,rollout": {"node_group": "mine", "placement": "all"}},
    }


async def timed(coro):
    started, cpu = time.perf_counter(), time.process_time()
    result = await coro
    return result, time.perf_counter() - started, time.process_time() - cpu


async def controller_on(fake: FakeCluster, nodes: int) -> PlacementController:
    """``fake`` given a head and ``nodes`` GPU nodes, and a recovered controller on it."""
    fake.add_node(num_cpus=8, head=True)
    for _ in range(nodes):
        fake.add_node(num_gpus=GPUS, num_cpus=2 * GPUS)
    ctl = PlacementController(io=fake, settings=QUIET)
    while not (await ctl.health())["recovered"]:
        await asyncio.sleep(0)
    return ctl


async def one_size(nodes: int, reps: int) -> dict:
    fake = QuietCluster(latency=RAY)
    ctl = await controller_on(fake, nodes)
    total = nodes + 1
    big = min(128, nodes // 4)
    # everything but the big job's nodes and a few spares goes to 8-node jobs
    others = (nodes - big - 8) // 8
    for j in range(others):
        await ctl.reserve(f"j{j}", job_spec(1 + big + 8 * j, 8, total), 3600)
    out: dict = {"nodes": nodes, "jobs": others + 1, "big": big}

    def ray_since(mark: float) -> float:
        return fake.ray_seconds - mark

    own, modelled, written = [], [], []
    for _ in range(reps):
        mark, bytes0 = fake.ray_seconds, fake.bytes_written
        _, wall, _ = await timed(ctl.reserve("big", job_spec(1, big, total), 3600))
        own.append(wall)
        modelled.append(ray_since(mark))
        written.append(fake.bytes_written - bytes0)
        mark = fake.ray_seconds
        _, wall, _ = await timed(ctl.release("big"))
        out.setdefault("release_own", []).append(wall)
        out.setdefault("release_ray", []).append(ray_since(mark))
    out.update(reserve_own=own, reserve_ray=modelled, reserve_bytes=written)
    small = []
    for _ in range(reps):
        _, wall, _ = await timed(ctl.reserve("small", job_spec(1, 8, total), 3600))
        small.append(wall)
        await ctl.release("small")
    out["reserve8_own"] = small
    # manual repair: a tick marks it degraded and leaves the repair to the benchmark
    await ctl.reserve("big", job_spec(1, big, total), 3600, False, "manual")

    # a mutation that moves no assignment: what it writes does not grow with the cluster
    bytes0 = fake.bytes_written
    await ctl.reserve("j0", job_spec(1 + big, 8, total), 3600, False, "manual")
    out["state_change_bytes"] = fake.bytes_written - bytes0

    quiet, quiet_cpu = [], []
    for _ in range(reps):
        _, wall, cpu = await timed(ctl.reconciler.tick(full=False))
        quiet.append(wall)
        quiet_cpu.append(cpu)
    out.update(tick_quiet=quiet, tick_quiet_cpu=quiet_cpu)
    full = []
    for _ in range(reps):
        mark = fake.ray_seconds
        _, wall, _ = await timed(ctl.reconciler.tick(full=True))
        full.append(wall)
        out.setdefault("tick_full_ray", []).append(ray_since(mark))
    out["tick_full"] = full

    # a node of the big job dies: the tick marks it, the repair replaces the slot (on
    # one of the spares, one node after another)
    for k in range(min(reps, 4)):
        victim = ctl.state.get("big").slots[k].node_id
        fake.kill_node(victim)
        _, wall, cpu = await timed(ctl.reconciler.tick(full=False))
        out.setdefault("tick_event", []).append(wall)
        assert ctl.state.get("big").state == "degraded"
        mark = fake.ray_seconds
        _, wall, _ = await timed(ctl.repair("big"))
        out.setdefault("repair_own", []).append(wall)
        out.setdefault("repair_ray", []).append(ray_since(mark))
        assert ctl.state.get("big").state == "ready", ctl.state.get("big").reason

    from clients.session import Controller

    attach = []
    for _ in range(reps):
        started = time.perf_counter()
        res = Controller(None, table=DriverTable(fake)).reservation("big")
        res.assignments("actor")
        attach.append(time.perf_counter() - started)
    out["attach"] = attach
    out["placements"] = 2 * big * GPUS
    await ctl.stop()
    return out


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f}"


def report(rows: list[dict]) -> None:
    print(
        "placectl's own cost (wall time; the fake never sleeps), Ray's modelled cost beside "
        "it; medians"
    )
    header = (
        "nodes  jobs  big  reserve big (ms)  Ray (s)  KB written  reserve 8 (ms)  "
        "release big (ms)  state change (B)  tick quiet (ms)  tick event (ms)  "
        "tick full (ms)  repair (ms)  Ray (s)  attach+assign (ms)"
    )
    print(header)
    for r in rows:
        print(
            f"{r['nodes']:>5}  {r['jobs']:>4}  {r['big']:>3}  {ms(r['reserve_own']):>16}  "
            f"{statistics.median(r['reserve_ray']):>7.2f}  "
            f"{statistics.median(r['reserve_bytes']) / 1024:>10.0f}  {ms(r['reserve8_own']):>14}  "
            f"{ms(r['release_own']):>16}  {r['state_change_bytes']:>16}  "
            f"{ms(r['tick_quiet']):>15}  {ms(r['tick_event']):>15}  {ms(r['tick_full']):>14}  "
            f"{ms(r['repair_own']):>11}  {statistics.median(r['repair_ray']):>7.2f}  "
            f"{ms(r['attach']):>18}"
        )


def real_row(raylets: int, results: Results) -> None:
    """The operations real Ray can run here, on a local cluster of ``raylets`` nodes."""
    import ray

    import clients

    with local_cluster(raylets, gpus=GPUS, log_level="ERROR"):
        ctl = clients.connect()
        spec = job_spec(1, raylets, raylets + 1)
        reserve, release, attach, parts = [], [], [], []
        for _ in range(3):
            started = time.perf_counter()
            ctl.reserve("real", spec, timeout_s=600, progress=lambda m: None)
            reserve.append(time.perf_counter() - started)
            parts.append(ray.get(ctl.handle.timings.remote()))
            started = time.perf_counter()
            res = clients.Controller(None).reservation("real")
            res.assignments("actor")
            attach.append(time.perf_counter() - started)
            started = time.perf_counter()
            ctl.release("real")
            release.append(time.perf_counter() - started)
        for name, values in (("reserve", reserve), ("release", release), ("attach", attach)):
            results.add(f"real {name} @{raylets}", values)
        print(
            f"real Ray, {raylets} raylets x {GPUS} fake GPUs, one {raylets}-node job: "
            f"reserve {ms(reserve)} ms (placectl + Ray), release {ms(release)} ms, "
            f"attach+assignments {ms(attach)} ms; samples reserve "
            + " ".join(f"{x * 1000:.0f}" for x in reserve)
        )
        for key in ("plan_s", "place_s", "probe_s"):
            values = [p[key] for p in parts]
            print(f"  of which {key[:-2]}: {ms(values)} ms (median)")


def record(row: dict, results: Results) -> None:
    """Every series of one size's row, as measures named ``<series> @<nodes>``."""
    for key, values in row.items():
        if isinstance(values, list):
            unit = "bytes" if key.endswith("bytes") else "s"
            results.add(f"{key} @{row['nodes']}", values, unit=unit)


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--sizes", default="100,1000,4000")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--real", type=int, default=0, help="raylets for the real-cluster row")
    args = ap.parse_args()
    results = Results("control_plane", args)
    rows = []
    for size in (int(s) for s in args.sizes.split(",") if s.strip()):
        rows.append(asyncio.run(one_size(size, args.reps)))
        record(rows[-1], results)
        print(f"  measured {size} nodes", file=sys.stderr, flush=True)
    if rows:
        report(rows)
    if args.real:
        real_row(args.real, results)
    results.write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
