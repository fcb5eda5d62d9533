#!/usr/bin/env python3
"""Network faults on real hosts, placectl beside Ray alone in one run.

A Ray cluster of five hosts in network namespaces (clients.testing.hosts; Ray's default
health checks): head on 192.0.2.1, four worker hosts of 2 fake GPUs. Each side gets a
fresh cluster per scenario and a driver on the head:

* **placectl**: the job of tests/integration/data/network.yaml (4 GPUs on two worker
  hosts, two free), a WorkerGroup of 4 ranks, ``repair()`` called the instant the fault
  is put on;
* **Ray alone**: one plain actor pinned on each worker host, nothing else.

Scenarios:

* ``cut``: a job host cut off for good. placectl: seconds until ``repair()`` returns
  (its ranks relaunched elsewhere) and until the host is fenced (its grace); Ray alone:
  seconds until Ray's node table calls the host dead.
* ``refused``: a job host's raylet killed, the host up (its port refused). placectl:
  seconds until ``repair()`` has relaunched the host's ranks (called again, as a job's
  next step would, while they still answered); Ray alone: until Ray calls the host dead.
* ``blips``: every shape of blip for ``--blip`` seconds (default 5), one after another on
  one cluster: a job host cut off, the job's hosts split from the head's side, the head's
  side split from the job's hosts, the head's own link, a lossy link (30%); after each,
  the nodes lost (dead in Ray's table) and the ranks whose process changed.

Needs root, iproute2 and iptables. Usage: scripts/bench/bench_network.py
[--scenarios cut,refused,blips] [--blip 5] [--json PATH]
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


def _dead(driver: Driver) -> list[str]:
    return [n["ip"] for n in driver.ask("nodes", timeout=120)["nodes"] if not n["alive"]]


def _alive(driver: Driver) -> set[str]:
    return {n["ip"] for n in driver.ask("nodes", timeout=120)["nodes"] if n["alive"]}


def _job_hosts(hosts, driver: Driver, mode: str) -> list[int]:
    """The job's two hosts (placectl: where its ranks run; Ray alone: the first two)."""
    if mode != "placectl":
        return [1, 2]
    ips = {r["ip"] for r in driver.ask("where")["ranks"] if r}
    return [h.index for h in hosts.hosts if h.ip in ips]


def _side(mode: str, run) -> dict:
    with harness.Hosts(workers=4, gpus=2, cpus=2) as hosts:
        driver = Driver(hosts, mode=mode, config=CONFIG if mode == "placectl" else None)
        try:
            return run(hosts, driver)
        finally:
            driver.close()


def _until_dead(driver: Driver, started: float, limit: float = 300.0) -> float:
    while time.monotonic() - started < limit:
        if _dead(driver):
            return time.monotonic() - started
        time.sleep(0.5)
    return float("nan")


def cut(mode: str) -> dict:
    def run(hosts, driver):
        victim = _job_hosts(hosts, driver, mode)[0]
        started = time.monotonic()
        hosts.cut(victim)
        if mode != "placectl":
            return {"dead": _until_dead(driver, started)}
        got = driver.ask("repair", timeout=180)
        repaired = time.monotonic() - started
        # Out once fenced or dead in Ray's table, whichever is seen first: a fenced node
        # is dead to Ray at once, and leaves the controller's fenced list then.
        ip = hosts.hosts[victim].ip
        while ip not in _dead(driver) and not driver.ask("health")["fenced"]:
            if time.monotonic() - started > 300:
                break
            time.sleep(0.5)
        out = time.monotonic() - started
        said = [m for kind, m in driver.ask("events")["events"] if kind == "fenced"]
        by = "placectl" if any(ip in m for m in said) else "Ray"
        return {"repair": repaired, "lost": got["lost"], "fenced": out, "by": by}

    return _side(mode, run)


def refused(mode: str) -> dict:
    def run(hosts, driver):
        victim = _job_hosts(hosts, driver, mode)[0]
        started = time.monotonic()
        hosts.kill_raylet(victim)
        if mode != "placectl":
            return {"dead": _until_dead(driver, started)}
        # As a job's loop: repair() the instant the fault is on; if its ranks still
        # answered then (the raylet's workers outlive it by a moment), the next step
        # fails and repair() runs again.
        calls = 0
        while True:
            got = driver.ask("repair", timeout=180)
            calls += 1
            if got["lost"] or time.monotonic() - started > 180:
                break
            time.sleep(0.5)  # the next step, which fails
        return {"repair": time.monotonic() - started, "lost": got["lost"], "calls": calls}

    return _side(mode, run)


SHAPES = {
    "a job host cut off": lambda h, job, idle: h.cut(job[0]),
    "the job's hosts split from the head's side": lambda h, job, idle: h.split(job, [0, *idle]),
    "the head's side split from the job's": lambda h, job, idle: h.split(
        [0, idle[0]], [*job, idle[1]]
    ),
    "the head's own link down": lambda h, job, idle: h.cut(0),
    "a lossy link (30%)": lambda h, job, idle: h.degrade(job[0], loss=0.3),
}


def blips(mode: str, seconds: float) -> list[dict]:
    def run(hosts, driver):
        out = []
        for shape, fault in SHAPES.items():
            time.sleep(30)  # Ray's GCS reaches a healed host only after its backoff
            # A host Ray gave up on is rebooted for the next (its old node stays dead in
            # Ray's table: a host is down when it has no node alive).
            alive = _alive(driver)
            down = [h for h in hosts.hosts[1:] if h.ip not in alive]
            if down:
                hosts.restart(*down)
            dead_before = len(_dead(driver))
            before = _pids(driver)
            job = _job_hosts(hosts, driver, mode)
            idle = [h.index for h in hosts.hosts[1:] if h.index not in job]
            fault(hosts, job, idle)
            if mode == "placectl":
                driver.send("repair")
            time.sleep(seconds)
            hosts.heal_all()
            if mode == "placectl":
                driver.wait("repair", 240)
            time.sleep(15)
            after = _pids(driver)
            changed = sum(a != b for a, b in zip(before, after, strict=True))
            lost = len(_dead(driver)) - dead_before
            out.append({"shape": shape, "nodes_lost": lost, "ranks": changed})
            print(f"  {mode}: {shape}, {seconds:g}s -> {out[-1]}", flush=True)
        return out

    return _side(mode, run)


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--scenarios", default="cut,refused,blips")
    ap.add_argument("--blip", type=float, default=5.0, help="seconds each blip lasts")
    args = ap.parse_args()
    why = harness.unavailable()
    if why is not None:
        sys.exit(f"bench_network: cannot run hosts here: {why}")
    res = Results("bench_network", args)
    wanted = args.scenarios.split(",")
    if "cut" in wanted:
        ray_alone, placectl = cut("plain"), cut("placectl")
        res.add("cut host: Ray alone calls it dead", [ray_alone["dead"]])
        res.add("cut host: placectl repair() returns", [placectl["repair"]],
                baseline="cut host: Ray alone calls it dead", lost=placectl["lost"])  # fmt: skip
        res.add("cut host: out (placectl's fence at its grace, or Ray's verdict)",
                [placectl["fenced"]], baseline="cut host: Ray alone calls it dead",
                by=placectl["by"])  # fmt: skip
        print(f"cut: Ray alone dead after {ray_alone['dead']:.1f}s; placectl repair() "
              f"{placectl['repair']:.1f}s, out after {placectl['fenced']:.1f}s "
              f"({placectl['by']})")  # fmt: skip
    if "refused" in wanted:
        ray_alone, placectl = refused("plain"), refused("placectl")
        res.add("refused raylet: Ray alone calls it dead", [ray_alone["dead"]])
        base = "refused raylet: Ray alone calls it dead"
        res.add("refused raylet: placectl repair() has relaunched its ranks", [placectl["repair"]],
                baseline=base, lost=placectl["lost"], calls=placectl["calls"])  # fmt: skip
        print(f"refused: Ray alone dead after {ray_alone['dead']:.1f}s; placectl repair() "
              f"relaunched {placectl['lost']} after {placectl['repair']:.1f}s "
              f"({placectl['calls']} call(s))")  # fmt: skip
    if "blips" in wanted:
        for mode in ("plain", "placectl"):
            name = "Ray alone" if mode == "plain" else "placectl"
            for row in blips(mode, args.blip):
                res.add(f"{row['shape']}, {args.blip:g}s: nodes lost, {name}",
                        [row["nodes_lost"]], unit="nodes", ranks_changed=row["ranks"])  # fmt: skip
    res.write()


if __name__ == "__main__":
    main()
