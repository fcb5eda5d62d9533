#!/usr/bin/env python3
"""verl's own worker group against verl on placectl, side by side in one run.

A local cluster (a head and two raylets with 4 fake GPUs each) starts the same verl
``Worker`` subclass, one process per GPU, 8 ranks, in alternating trials:

* ``verl``: verl's ``RayWorkerGroup`` on its own ``RayResourcePool`` (it creates one
  placement group per node, then the workers), timed to every worker answering;
* ``placectl``: ``clients.integrations.verl.worker_group`` on a placectl reservation
  made beforehand, timed the same way; ``reserve + launch`` adds the reservation.

Then a driver restart, timed in a fresh driver process from ``ray.init`` to every worker
answering, each side at its best: verl re-attaches to its own detached workers
(``RayResourcePool(detached=True)``, ``RayWorkerGroup(detached=True)``, then
``RayWorkerGroup.from_detached`` in the new driver), or starts over as ``main_ppo`` does
(new placement groups and workers); placectl re-attaches to the reservation and its
detached workers, or re-launches workers into the kept reservation.

Usage: scripts/bench/bench_verl.py [--trials 3]
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import textwrap
import time

import ray
from harness import Results, local_cluster, parser
from ray.util.placement_group import (
    PlacementGroup,
    placement_group_table,
    remove_placement_group,
)
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray.base import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

import clients
from clients.integrations import verl as pverl
from clients.integrations.verl import VERL_VERSION
from clients.launching import WORKER_NAMESPACE

GPUS, NODES = 4, 2
SPEC = {"num_nodes": 1 + NODES, "component_placement": {"actor": f"0-{GPUS * NODES - 1}"}}


class BenchWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def ready(self):
        return self.rank


def cls() -> RayClassWithInitArgs:
    return RayClassWithInitArgs(cls=ray.remote(BenchWorker))


def stop(wg) -> None:
    for w in wg.workers:
        ray.kill(w)


def verl_own() -> float:
    started = time.perf_counter()
    pool = RayResourcePool(process_on_nodes=[GPUS] * NODES, use_gpu=True, max_colocate_count=1)
    wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=cls())
    assert wg.ready() == list(range(GPUS * NODES))
    took = time.perf_counter() - started
    stop(wg)
    for pg in pool.pgs:
        remove_placement_group(pg)
    return took


def on_placectl(ctl) -> tuple[float, float]:
    started = time.perf_counter()
    res = ctl.reserve("bench-verl", SPEC, timeout_s=300)
    reserved = time.perf_counter()
    wg = pverl.worker_group(res, "actor", cls())
    assert wg.ready() == list(range(GPUS * NODES))
    done = time.perf_counter()
    stop(wg)
    ctl.release("bench-verl")
    return done - reserved, done - started


# A new driver process; its worker class is defined here, so Ray ships it by value (a
# `scripts` package in site-packages shadows this directory for imports).
RESTART = """
import json, sys, time
started = time.perf_counter()
import ray, clients
from clients.integrations import verl as pverl
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray.base import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
GPUS, NODES = int(sys.argv[3]), int(sys.argv[4])

class BenchWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def ready(self):
        return self.rank

def cls():
    return RayClassWithInitArgs(cls=ray.remote(BenchWorker))

mode = sys.argv[2]
# verl's detached workers are named actors of the driver's namespace: both drivers use one.
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False, namespace="bench-verl")
if mode in ("verl", "verl-detached"):
    detached = mode == "verl-detached"
    pool = RayResourcePool(
        process_on_nodes=[GPUS] * NODES, use_gpu=True, max_colocate_count=1, detached=detached
    )
    wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=cls(), detached=detached)
elif mode == "verl-attach":
    wg = RayWorkerGroup.from_detached(worker_names=json.loads(sys.argv[5]), ray_cls_with_init=cls())
else:
    res = clients.connect().reservation("bench-verl")
    if mode == "attach":
        wg = pverl.attach(res, "actor", cls())
    else:
        wg = pverl.worker_group(res, "actor", cls(), detached=True)
assert wg.ready() == list(range(GPUS * NODES))
print(json.dumps({"s": time.perf_counter() - started, "names": wg.worker_names}))
"""


def restarted_driver(address: str, mode: str, names: list[str] = ()) -> tuple[float, list[str]]:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(RESTART),
            address,
            mode,
            str(GPUS),
            str(NODES),
            json.dumps(list(names)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        raise SystemExit(f"the {mode} driver failed:\n{out.stderr[-3000:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return got["s"], got["names"]


def wait_all_free(timeout: float = 120.0) -> None:
    """Until every GPU is free again (a dead driver's groups go asynchronously)."""
    deadline = time.monotonic() + timeout
    while ray.available_resources().get("GPU", 0) < GPUS * NODES:
        if time.monotonic() > deadline:
            raise SystemExit(f"GPUs still held after {timeout:.0f} s")
        time.sleep(0.2)


def kill_named(names: list[str], namespace: str | None = None) -> None:
    for n in names:
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(n, namespace=namespace))


def remove_detached_groups() -> None:
    """The placement groups verl made detached (it never removes them itself)."""
    for gid, info in placement_group_table().items():
        if info["state"] != "REMOVED" and "verl_group" in (info.get("name") or ""):
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(gid))))


def line(label: str, samples: list[float], base: float | None = None) -> str:
    med = statistics.median(samples)
    ratio = f"  ({med / base:.2f}x verl)" if base else ""
    each = " ".join(f"{s:.1f}" for s in samples)
    return f"  {label:<34} median {med:6.1f} s{ratio}   samples {each}"


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()
    results = Results("verl", args)
    with local_cluster(NODES, gpus=GPUS, log_level="ERROR") as (cluster, _):
        ctl = clients.connect()
        print(f"{NODES} nodes x {GPUS} fake GPUs, {NODES * GPUS} verl workers, verl {VERL_VERSION}")
        try:
            own, launch, total = [], [], []
            for t in range(args.trials):
                # alternate which side goes first, so neither always gets the warmer cluster
                if t % 2 == 0:
                    own.append(verl_own())
                    a, b = on_placectl(ctl)
                else:
                    a, b = on_placectl(ctl)
                    own.append(verl_own())
                launch.append(a)
                total.append(b)
                print(
                    f"  trial {t + 1}: verl {own[-1]:.1f} s, "
                    f"placectl {a:.1f} s (+reserve {b:.1f} s)"
                )
            results.add("verl launch", own)
            results.add("placectl launch", launch, baseline="verl launch")
            results.add("placectl reserve + launch", total, baseline="verl launch")
            base = statistics.median(own)
            print("launch to all ready")
            print(line("verl RayWorkerGroup + own pool", own))
            print(line("placectl worker_group", launch, base))
            print(line("placectl reserve + worker_group", total, base))

            print("driver restart, fresh driver process to all ready")
            verl_restart, verl_attach, attach, relaunch = [], [], [], []
            for _ in range(args.trials):
                # verl's groups and workers end with its driver: the next one starts over
                verl_restart.append(restarted_driver(cluster.address, "verl")[0])
                wait_all_free()
                # unless they were made detached: a later driver re-attaches by name
                _, names = restarted_driver(cluster.address, "verl-detached")
                verl_attach.append(restarted_driver(cluster.address, "verl-attach", names)[0])
                kill_named(names, "bench-verl")
                remove_detached_groups()
                wait_all_free()
                # placectl's reservation outlives drivers: launch detached workers into it,
                # then a later driver re-attaches to them
                ctl.reserve("bench-verl", SPEC, timeout_s=300)
                s, names = restarted_driver(cluster.address, "relaunch")
                relaunch.append(s)
                attach.append(restarted_driver(cluster.address, "attach")[0])
                kill_named(names, WORKER_NAMESPACE)
                ctl.release("bench-verl")
                wait_all_free()
            results.add("verl driver restart", verl_restart)
            results.add("verl re-attach", verl_attach)
            results.add("placectl relaunch", relaunch, baseline="verl driver restart")
            results.add("placectl re-attach", attach, baseline="verl re-attach")
            base, base_attach = statistics.median(verl_restart), statistics.median(verl_attach)
            print(line("verl: new groups + workers", verl_restart))
            print(line("placectl: relaunch into reservation", relaunch, base))
            print(line("verl: re-attach its detached workers", verl_attach))
            print(line("placectl: re-attach detached workers", attach, base_attach))
        finally:
            ctl.release_all()
    results.write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
