#!/usr/bin/env python3
"""Network faults on real hosts, placectl beside Ray alone in one run.

A Ray cluster of four hosts in network namespaces (clients.testing.hosts; Ray's default
health checks): head on 192.0.2.1, three worker hosts of 2 fake GPUs. Each side gets a
fresh cluster per scenario and a driver on the head:

* **placectl**: the job of tests/integration/data/network.yaml (4 GPUs on the first two
  worker hosts, the third spare), a WorkerGroup of 4 ranks, ``repair()`` called the
  instant the fault is put on;
* **Ray alone**: one plain actor pinned on each worker host, nothing else.

Scenarios:

* ``cut``: the first worker host cut off both ways. placectl: seconds until
  ``repair()`` returns with its ranks relaunched on the spare; Ray alone: seconds until
  Ray's node table calls the host dead.
* ``head``: the head's own link down for 5, 10 and 20 s, then back; 15 s later, the
  nodes Ray calls dead and the ranks (actors) that are not the same processes.
* ``loss``: 30% of packets lost both ways on the first worker host for 60 s: fences
  (placectl) and nodes lost, and ranks that changed.

Needs root and iproute2. Usage: scripts/bench/bench_network.py [--scenarios cut,head,loss]
[--blips 5,10,20] [--json PATH]
"""

from __future__ import annotations

import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from harness import Results, parser

from clients.testing import hosts as harness
from clients.testing.host_driver import Driver

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "integration" / "data" / "network.yaml"


def _pids(driver: Driver) -> list:
    return [r and r["pid"] for r in driver.ask("where")["ranks"]]


def _dead_nodes(driver: Driver) -> int:
    return sum(not n["alive"] for n in driver.ask("nodes")["nodes"])


def _side(mode: str, run) -> dict:
    with harness.Hosts(workers=3, gpus=2, cpus=2) as hosts:
        driver = Driver(hosts, mode=mode, config=CONFIG if mode == "placectl" else None)
        try:
            return run(hosts, driver)
        finally:
            driver.close()


def cut(mode: str) -> dict:
    def run(hosts, driver):
        started = time.monotonic()
        hosts.cut(1)
        if mode == "placectl":
            got = driver.ask("repair", timeout=180)
            return {"seconds": time.monotonic() - started, "lost": got["lost"]}
        while time.monotonic() - started < 300:  # Ray's verdict: the node table
            if _dead_nodes(driver):
                return {"seconds": time.monotonic() - started}
            time.sleep(0.5)
        return {"seconds": float("nan")}

    return _side(mode, run)


def head(mode: str, blips: list[float]) -> list[dict]:
    def run(hosts, driver):
        out = []
        for seconds in blips:
            before = _pids(driver)
            hosts.cut(0)
            if mode == "placectl":
                driver.send("repair")
            time.sleep(seconds)
            hosts.heal(0)
            if mode == "placectl":
                driver.wait("repair", 180)
            time.sleep(15)
            after = _pids(driver)
            changed = sum(a != b for a, b in zip(before, after, strict=True))
            out.append({"blip": seconds, "nodes_lost": _dead_nodes(driver), "ranks": changed})
            print(f"  {mode}: head down {seconds:g}s -> {out[-1]}", flush=True)
        return out

    return _side(mode, run)


def loss(mode: str, seconds: float = 60.0) -> dict:
    def run(hosts, driver):
        before = _pids(driver)
        hosts.degrade(1, loss=0.3)
        time.sleep(seconds)
        hosts.heal(1)
        time.sleep(5)
        after = _pids(driver)
        fenced = len(driver.ask("health")["fenced"]) if mode == "placectl" else 0
        changed = sum(a != b for a, b in zip(before, after, strict=True))
        return {"fenced": fenced, "nodes_lost": _dead_nodes(driver), "ranks": changed}

    return _side(mode, run)


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--scenarios", default="cut,head,loss")
    ap.add_argument("--blips", default="5,10,20", help="seconds the head's link is down")
    args = ap.parse_args()
    why = harness.unavailable()
    if why is not None:
        sys.exit(f"bench_network: cannot run hosts here: {why}")
    res = Results("bench_network", args)
    wanted = args.scenarios.split(",")
    if "cut" in wanted:
        ray_alone, placectl = cut("plain"), cut("placectl")
        res.add("cut host: Ray alone calls it dead", [ray_alone["seconds"]])
        res.add(
            "cut host: placectl repair() returns",
            [placectl["seconds"]],
            baseline="cut host: Ray alone calls it dead",
            lost=placectl["lost"],
        )
        print(f"cut: Ray alone {ray_alone['seconds']:.1f}s, placectl {placectl['seconds']:.1f}s")
    if "head" in wanted:
        blips = [float(x) for x in args.blips.split(",")]
        for mode in ("plain", "placectl"):
            for row in head(mode, blips):
                name = "Ray alone" if mode == "plain" else "placectl"
                res.add(
                    f"head down {row['blip']:g}s: nodes lost, {name}",
                    [row["nodes_lost"]],
                    unit="nodes",
                    ranks_changed=row["ranks"],
                )
    if "loss" in wanted:
        for mode in ("plain", "placectl"):
            row = loss(mode)
            name = "Ray alone" if mode == "plain" else "placectl"
            res.add(f"30% loss 60s: nodes lost, {name}", [row["nodes_lost"]], unit="nodes", **row)
            print(f"loss: {name} {row}", flush=True)
    res.write()


if __name__ == "__main__":
    main()
