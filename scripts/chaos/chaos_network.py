#!/usr/bin/env python3
"""Seeded network chaos on real hosts: a Ray cluster of hosts in network namespaces
(clients.testing.hosts; Ray's default health checks), a job of 4 GPUs on two worker
hosts with spares (tests/integration/data/network.yaml), its driver on the head calling
``repair()`` the instant each fault is put on, as a user's loop would.

Steps, drawn at random:

* ``cut``: a host holding ranks cut off both ways, or one way only (nothing in, or
  nothing out); healed after the repair, then rebooted (a new node, a spare again).
* ``blip``: a host holding ranks cut off for 1-5 s, shorter than the grace: it may be
  suspected and its ranks moved, but no node is lost; healed, nothing of a moved rank
  lives on it.
* ``split``: a two-sided split for 2-10 s, the job's hosts on either side: on the
  minority (the head's side moves the job away, reversibly) or with the majority (the
  controller suspects itself and moves nothing); no node lost.
* ``reject``: a firewall on the head rejecting a job host (a TCP reset) for 5-10 s: a
  refusal that is the network's proves nothing; nothing moves.
* ``flap``: a job host's link down 2-4 s and up 3-6 s, three or four times: nothing
  fenced, no node lost; healed, nothing of a moved rank lives on it.
* ``restart``: a job host cut off for 10-20 s and the controller killed 2-6 s after the
  cut (before, during or after the slot's move), ``repair()`` in flight: as a blip, and
  once healed the restarted controller sweeps the host (a ``back`` event) if its ranks
  moved.
* ``head``: the head's own link down for 1-12 s, then back.
* ``loss``: 30% of packets lost both ways on a host holding ranks, for 10 s.
* ``crash``: a host holding ranks loses its power (every process killed at once, Ray
  not told); then rebooted.
* ``drain``: a spot notice for a host holding ranks (Ray's PREEMPTION drain, a minute's
  deadline); the driver waits for the reservation's next epoch and moves its ranks;
  then the host goes (rebooted).

``--token`` runs the whole cluster with Ray's token authentication on.

Invariants, each checked against the outside (the ranks' own answers, the hosts'
process tables, Ray's node table):

* after every step every rank answers, each from a process of its own;
* a cut or crashed host's ranks, and only they, are relaunched, away from it; once
  healed, no process of the old ranks lives on it;
* a drained host's ranks, and only they, move, and none of them dies before it moves;
* a head blip, a lossy link or a rejecting firewall relaunches nothing and fences nothing:
  the same pids;
* a blip or a split fences nothing and loses no node (but one Ray's own health checks
  give up, which Ray alone does too); after it every rank answers from one process, and
  no process of a moved rank lives on any host.

Usage: scripts/chaos/chaos_network.py [--steps 50] [--seed 1] [--minutes 30] [--token]
       [--kinds flap,restart]
Prints every step and every violation; exits 1 on any.
"""

from __future__ import annotations

import argparse
import pathlib
import random
import secrets
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from clients.testing import host_driver
from clients.testing import hosts as harness
from clients.testing.host_driver import Driver

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "integration" / "data" / "network.yaml"
# The draw: each kind as often as it is named.
KINDS = ["cut", "cut", "crash", "drain", "head", "loss", "blip", "blip", "split", "reject",
         "flap", "restart"]  # fmt: skip


class Run:
    def __init__(self, hosts: harness.Hosts, seed: int, kinds: list[str] = KINDS) -> None:
        self.hosts = hosts
        self.kinds = kinds
        self.rng = random.Random(seed)
        self.driver = Driver(hosts, config=CONFIG)
        self.violations: list[str] = []
        self.seen: set[str] = set()  # the nodes alive as the last step began
        self.last: list = []  # where the ranks answered from as the last step ended
        self.counts: dict[str, int] = {}

    def fail(self, step: int, what: str) -> None:
        self.violations.append(f"step {step}: {what}")
        print(f"  VIOLATION: {what}", flush=True)

    def answering(self, timeout: float = 90.0) -> list:
        deadline = time.monotonic() + timeout
        while True:
            ranks = self.driver.ask("where", timeout=60)["ranks"]
            if all(ranks) or time.monotonic() > deadline:
                return ranks
            time.sleep(0.5)

    def host_of(self, ip: str) -> harness.Host:
        return next(h for h in self.hosts.hosts if h.ip == ip)

    def check_whole(self, step: int, ranks: list) -> None:
        if not all(ranks):
            self.fail(step, f"ranks do not answer: {ranks}")
        pids = [r["pid"] for r in ranks if r]
        if len(set(pids)) != len(pids):
            self.fail(step, f"two ranks in one process: {pids}")

    def step(self, n: int) -> None:
        kind = self.rng.choice(self.kinds)
        self.counts[kind] = self.counts.get(kind, 0) + 1
        before = self.answering()
        if not all(before):
            # Ray's late verdict on a node a fault of the last step touched (its health
            # check's connection in its backoff up to 26 s after a heal) is Ray's, and
            # Ray alone loses the node too: its ranks are repaired, no violation.
            late = self.given_up(n, self.seen)
            gone = {(self.last[i] or {}).get("ip") for i, r in enumerate(before)
                    if not r and self.last}  # fmt: skip
            if not gone or not gone <= late:
                self.fail(n, f"ranks do not answer before the step: {before}")
                self.driver.ask("repair", timeout=180)
            before = self.answering()
            if not all(before):
                raise RuntimeError("the job could not be repaired; the run stops")
        fenced = dict(self.driver.ask("health")["fenced"])
        nodes = {x["node"] for x in self.driver.ask("nodes")["nodes"] if x["alive"]}
        self.seen = nodes
        if kind == "head":
            seconds = self.rng.uniform(1, 12)
            print(f"step {n}: the head's link down {seconds:.1f}s", flush=True)
            self.hosts.cut(0)
            self.driver.send("repair")
            time.sleep(seconds)
            self.hosts.heal(0)
            self.unchanged(n, before, fenced, nodes)
        elif kind == "loss":
            victim = self.host_of(self.rng.choice([r["ip"] for r in before]))
            print(f"step {n}: 30% loss on {victim.ip} for 10s", flush=True)
            self.hosts.degrade(victim, loss=0.3)
            self.driver.send("repair")
            time.sleep(10)
            self.hosts.heal(victim)
            self.unchanged(n, before, fenced, nodes)
        elif kind == "reject":
            victim = self.host_of(self.rng.choice([r["ip"] for r in before]))
            seconds = self.rng.uniform(5, 10)
            print(f"step {n}: the head rejects {victim.ip} for {seconds:.1f}s", flush=True)
            self.hosts.reject(0, victim)
            self.driver.send("repair")
            time.sleep(seconds)
            self.hosts.heal_all()
            self.unchanged(n, before, fenced, nodes)
        elif kind in ("blip", "split"):
            self.blip(n, before, fenced, split=kind == "split")
        elif kind == "flap":
            self.flap(n, before, fenced)
        elif kind == "restart":
            self.restart(n, before, fenced)
        elif kind == "drain":
            self.drain(n, before)
        else:
            self.cut(n, before, crash=kind == "crash")
        self.last = self.answering()
        self.check_whole(n, self.last)

    def unchanged(self, n: int, before: list, fenced: dict, nodes: set) -> None:
        """Nothing relaunched, nothing fenced, the same processes: but the ranks of a
        node Ray's own health checks gave up (:meth:`given_up`), lost whatever placectl
        believes."""
        got = self.driver.wait("repair", 180)
        by_ray = self.given_up(n, nodes)
        theirs = {i for i, r in enumerate(before) if r["ip"] in by_ray}
        if by_ray:
            print(f"  Ray's health checks gave {sorted(by_ray)} up, ranks {sorted(theirs)}",
                  flush=True)  # fmt: skip
        if set(got["lost"]) - theirs:
            self.fail(n, f"relaunched {got['lost']}")
        after = self.answering()
        kept = [i for i in range(len(before)) if i not in theirs]
        if any(not after[i] or after[i]["pid"] != before[i]["pid"] for i in kept):
            self.fail(n, "the ranks' processes changed")
        if self.driver.ask("health")["fenced"] != fenced:
            self.fail(n, "a node was fenced")

    def blip(self, n: int, before: list, fenced: dict, split: bool) -> None:
        job = sorted({self.host_of(r["ip"]).index for r in before})
        idle = [h.index for h in self.hosts.hosts[1:] if h.index not in job]
        nodes = {x["node"] for x in self.driver.ask("nodes")["nodes"] if x["alive"]}
        if split:
            seconds = self.rng.uniform(2, 10)
            minority = self.rng.random() < 0.5
            sides = (job, [0, *idle]) if minority else ([0, idle[0]], [*job, *idle[1:]])
            print(f"step {n}: hosts {sides[0]} split from {sides[1]} for {seconds:.1f}s",
                  flush=True)  # fmt: skip
            self.hosts.split(*sides)
        else:
            seconds = self.rng.uniform(1, 5)
            victim = self.rng.choice(job)
            print(f"step {n}: {self.hosts.hosts[victim].ip} cut off {seconds:.1f}s", flush=True)
            self.hosts.cut(victim)
        self.driver.send("repair")
        time.sleep(seconds)
        self.hosts.heal_all()
        self.healed(n, before, fenced, nodes)

    def flap(self, n: int, before: list, fenced: dict) -> None:
        """A job host's link flapping: down 2-4 s, up 3-6 s, three or four times, the
        driver's repair() sent at the first drop."""
        victim = self.rng.choice(sorted({self.host_of(r["ip"]).index for r in before}))
        nodes = {x["node"] for x in self.driver.ask("nodes")["nodes"] if x["alive"]}
        count = self.rng.randint(3, 4)
        cycles = [(self.rng.uniform(2, 4), self.rng.uniform(3, 6)) for _ in range(count)]
        said = ", ".join(f"{down:.1f}s down {up:.1f}s up" for down, up in cycles)
        print(f"step {n}: {self.hosts.hosts[victim].ip} flaps: {said}", flush=True)
        for c, (down, up) in enumerate(cycles):
            self.hosts.cut(victim)
            if c == 0:
                self.driver.send("repair")
            time.sleep(down)
            self.hosts.heal_all()
            time.sleep(up)
        self.healed(n, before, fenced, nodes)

    def restart(self, n: int, before: list, fenced: dict) -> None:
        """A job host cut off for 10-20 s (past the suspicion, short of the grace), and
        the controller killed 2-6 s after the cut (before, during or after the slot's
        move), the driver's repair() in flight; once healed, the restarted controller
        must have kept the host's doubt: a ``back`` event for it, nothing fenced."""
        victim = self.rng.choice(sorted({self.host_of(r["ip"]).index for r in before}))
        ip = self.hosts.hosts[victim].ip
        nodes = {x["node"] for x in self.driver.ask("nodes")["nodes"] if x["alive"]}
        seconds, kill_at = self.rng.uniform(10, 20), self.rng.uniform(2, 6)
        print(f"step {n}: {ip} cut off {seconds:.1f}s, the controller killed at {kill_at:.1f}s",
              flush=True)  # fmt: skip
        backs = self.backs(ip)
        cut_at = time.monotonic()
        self.hosts.cut(victim)
        self.driver.send("repair")
        time.sleep(kill_at)
        took = host_driver.restart_controller(self.hosts)
        print(f"  the controller back in {took}s", flush=True)
        time.sleep(max(0.0, cut_at + seconds - time.monotonic()))
        self.hosts.heal_all()
        moved = self.healed(n, before, fenced, nodes)
        if moved and self.backs(ip) == backs:  # its ranks moved: owed a sweep when back
            self.fail(n, f"no 'back' event for {ip} after the restart and the heal")

    def backs(self, ip: str) -> int:
        return sum(
            1 for kind, m in self.driver.ask("events")["events"] if kind == "back" and ip in m
        )

    def healed(self, n: int, before: list, fenced: dict, nodes: set) -> list:
        """After a fault shorter than the grace, healed: nothing fenced, no node lost
        but to Ray's own health checks, every moved rank's old process gone; the ranks
        repair() relaunched."""
        got = self.driver.wait("repair", 240)
        print(f"  repaired {got['lost']} in {got['seconds']}s", flush=True)
        if self.driver.ask("health")["fenced"] != fenced:
            self.fail(n, "a node was fenced")
        after = self.answering()
        old = {r["pid"] for r in before} - {r["pid"] for r in after if r}
        deadline = time.monotonic() + 60
        running = set()
        while time.monotonic() < deadline:
            running = {p for h in self.hosts.hosts for p in self.hosts.pids(h)}
            if not old & running:
                break
            time.sleep(0.5)
        if old & running:
            self.fail(n, f"processes of moved ranks still run: {sorted(old & running)}")
        self.given_up(n, nodes)
        time.sleep(30)  # Ray frees a healed host's moved groups once its GCS reaches it
        return got["lost"]

    def given_up(self, n: int, nodes: set) -> set[str]:
        """The addresses of the nodes of ``nodes`` (alive before the step) that Ray's own
        health checks gave up during it, which Ray alone does too after a fault of some
        seconds (its health check's connection still in its backoff after the heal): a
        node lost any other way is a violation. A host left with no live node is
        rebooted; one whose node died only after it was rebooted already (a step
        before: a drain, a cut) holds a live node again and is left alone."""
        table = self.driver.ask("nodes")["nodes"]
        alive = {x["ip"] for x in table if x["alive"]}
        out, rebooted = set(), []
        for x in table:
            if x["node"] not in nodes or x["alive"]:
                continue
            if "health check" not in x["why"]:
                self.fail(n, f"node {x['ip']} lost: {x['why']}")
                continue
            out.add(x["ip"])
            if x["ip"] not in alive:
                print(f"  Ray's health checks gave {x['ip']} up: rebooted", flush=True)
                rebooted.append(self.host_of(x["ip"]))
        if rebooted:  # all at once: the cluster is whole again only with every one back
            self.hosts.restart(*rebooted)
        if out:  # their ranks are gone: what a user's loop does on the failure
            got = self.driver.ask("repair", timeout=240)
            print(f"  repaired {got['lost']} in {got['seconds']}s", flush=True)
        return out

    def only_they_left(self, n: int, before: list, doomed: list, victim, how: str) -> None:
        """No rank answers from ``victim`` any more, and the ranks not ``doomed`` are the
        same processes as ``before``."""
        after = self.answering()
        if any(r and r["ip"] == victim.ip for r in after):
            self.fail(n, f"a rank is still on the {how} host")
        kept = [i for i in range(len(before)) if i not in doomed]
        if any(after[i] and after[i]["pid"] != before[i]["pid"] for i in kept):
            self.fail(n, "a rank on another host was relaunched")

    def drain(self, n: int, before: list) -> None:
        victim = self.host_of(self.rng.choice([r["ip"] for r in before]))
        doomed = [i for i, r in enumerate(before) if r["ip"] == victim.ip]
        node = before[doomed[0]]["node"]
        print(f"step {n}: {victim.ip} drained (spot notice), ranks {doomed}", flush=True)
        got = self.driver.ask(f"drain {node}", event="drain", timeout=300)
        print(f"  moved {got['moved']} in {got['seconds']}s", flush=True)
        if got["dead"]:
            self.fail(n, f"ranks {got['dead']} died before they moved")
        if got["moved"] != doomed:
            self.fail(n, f"moved {got['moved']}, on the drained host {doomed}")
        self.only_they_left(n, before, doomed, victim, "drained")
        self.hosts.restart(victim)  # the spot machine goes, and comes back a spare

    def cut(self, n: int, before: list, crash: bool = False) -> None:
        victim = self.host_of(self.rng.choice([r["ip"] for r in before]))
        way = "power lost" if crash else self.rng.choice(["both", "both", "in", "out"])
        doomed = [i for i, r in enumerate(before) if r["ip"] == victim.ip]
        print(f"step {n}: {victim.ip} cut off ({way}), ranks {doomed}", flush=True)
        if crash:
            self.hosts.crash(victim)
        else:
            self.hosts.cut(victim, way)
        got = self.driver.ask("repair", timeout=180)
        print(f"  repaired {got['lost']} in {got['seconds']}s", flush=True)
        if got["lost"] != doomed:
            self.fail(n, f"relaunched {got['lost']}, lost {doomed}")
        self.only_they_left(n, before, doomed, victim, "cut")
        self.hosts.heal(victim)
        old = {before[i]["pid"] for i in doomed}
        deadline = time.monotonic() + 60
        while old & set(self.hosts.pids(victim)) and time.monotonic() < deadline:
            time.sleep(0.5)
        if old & set(self.hosts.pids(victim)):
            self.fail(n, "a relaunched rank's old process lives on its healed host")
        self.hosts.restart(victim)  # rebooted: a spare again


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--minutes", type=float, default=30.0, help="stop after this long")
    ap.add_argument("--token", action="store_true", help="Ray's token authentication on")
    ap.add_argument("--kinds", help="only these kinds of step, comma-separated (default all)")
    args = ap.parse_args()
    kinds = args.kinds.split(",") if args.kinds else KINDS
    if unknown := set(kinds) - set(KINDS):
        sys.exit(f"chaos_network: --kinds {args.kinds!r}: {sorted(unknown)} unknown; "
                 f"the kinds are {', '.join(sorted(set(KINDS)))}")  # fmt: skip
    why = harness.unavailable()
    if why is not None:
        sys.exit(f"chaos_network: cannot run hosts here: {why}")
    started = time.monotonic()
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)} if args.token else {}
    with harness.Hosts(workers=4, gpus=2, cpus=2, env=env) as hosts:
        run = Run(hosts, args.seed, kinds)
        done = 0
        try:
            for n in range(args.steps):
                if time.monotonic() - started > args.minutes * 60:
                    break
                run.step(n)
                done += 1
        finally:
            run.driver.close()
    took = time.monotonic() - started
    print(
        f"chaos_network: {done} steps ({run.counts}) in {took:.0f}s, "
        f"{len(run.violations)} violations (seed {args.seed}"
        f"{', token authentication' if args.token else ''})"
    )
    for v in run.violations:
        print(f"  {v}")
    sys.exit(1 if run.violations else 0)


if __name__ == "__main__":
    main()
