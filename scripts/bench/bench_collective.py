#!/usr/bin/env python3
"""A lost peer in a collective: gloo alone beside placectl's guarded group, in one run.

A local cluster (a head, three raylets of 4 fake GPUs): a job of 8 ranks on two nodes,
one node free. Every rank forms a group and the ranks of the first node wait in an
all-reduce; then a peer on the second node is lost:

* ``hung``: every process of the second node stopped (SIGSTOP: a hung host, its
  connections open, Ray calling it alive);
* ``stopped``: one rank's process stopped on a live node;
* ``killed``: one rank's process killed (SIGKILL: its sockets close).

Two modes, each on a fresh group:

* ``gloo``: a plain gloo group with ``--gloo-timeout`` (30 s here; torch's default is 30
  minutes), nobody reacting: how long the survivors wait;
* ``guarded``: ``clients.GuardedGroup``, the driver calling ``repair()`` the instant the
  fault is put on (as a job's loop does): seconds to the survivors out of their call
  (``PeerLost``), and to the next all-reduce of all eight completed (the survivors
  reformed, the replacements formed).

Usage: scripts/bench/bench_collective.py [--scenarios hung,stopped,killed]
[--gloo-timeout 30] [--json PATH]
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import threading
import time

import psutil
import ray
from harness import Results, local_cluster, parser

import clients
from clients.testing import machines

GPUS = 4
SPEC = {"num_nodes": 3, "component_placement": {"actor": "0-7"}}


class Rank:
    def __init__(self) -> None:
        self.group = None
        self.plain = None

    def form(self, again: bool = False) -> str:
        from clients.collective import GuardedGroup

        self.group = self.group.reform(120) if again else GuardedGroup.form(120)
        return self.group.generation

    def form_plain(self, timeout_s: float) -> None:
        """A gloo group as a job forms one without placectl's guard."""
        import torch.distributed as dist

        env = os.environ
        store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]),
                              is_master=env["RANK"] == "0", wait_for_workers=False)  # fmt: skip
        size = int(env["WORLD_SIZE"])
        wait = datetime.timedelta(seconds=timeout_s)
        self.plain = dist.ProcessGroupGloo(store, int(env["RANK"]), size, wait)

    def reduce(self, plain: bool = False) -> dict:
        import torch

        from clients.collective import PeerLost

        t = torch.ones(2)
        try:
            if plain:
                self.plain.allreduce([t]).wait()
            else:
                self.group.all_reduce(t)
        except (PeerLost, RuntimeError) as e:
            return {"out": time.time(), "why": str(e).splitlines()[0][:200]}
        return {"sum": t[0].item(), "at": time.time()}

    def pid(self) -> int:
        return os.getpid()

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


def _resume(pid: int) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):  # the repair killed it as hung
        machines.signal_pid(pid, signal.SIGCONT)


def fault(cluster, scenario: str, group, nodes: list[str]):
    """Put the fault on; returns how to take it off."""
    if scenario == "hung":
        node = next(n for n in cluster.list_all_nodes() if n.node_id == nodes[4])
        procs = machines.hang(node)
        return lambda: machines.resume(node, procs)
    pid = ray.get(group.actors[5].pid.remote())
    if scenario == "stopped":
        machines.signal_pid(pid, signal.SIGSTOP)
        return lambda: _resume(pid)
    machines.signal_pid(pid, signal.SIGKILL)
    return lambda: None


def trial(cluster, ctl, scenario: str, mode: str, gloo_timeout: float) -> dict:
    res = ctl.reserve(f"{scenario}-{mode}", SPEC, timeout_s=120)
    group = clients.WorkerGroup.launch(res, "actor", Rank, detached=True)
    undo = lambda: None  # noqa: E731
    try:
        plain = mode == "gloo"
        if plain:
            ray.get([a.form_plain.remote(gloo_timeout) for a in group.actors])
        else:
            group.execute("form")
        ray.get([a.reduce.remote(plain) for a in group.actors])  # formed and answering
        nodes = ray.get([a.node.remote() for a in group.actors])
        assert len(set(nodes[4:])) == 1 and nodes[4] not in nodes[:4], nodes
        # Every rank the fault leaves calls the all-reduce, as a job's step does.
        lost = range(4, 8) if scenario == "hung" else [5]
        undo = fault(cluster, scenario, group, nodes)
        started = time.time()
        calling = [r for r in range(8) if r not in lost]
        waiting = [group.actors[r].reduce.remote(plain) for r in calling]
        out: dict = {}
        if not plain:
            repaired: dict = {}

            def repair() -> None:
                repaired["ranks"] = group.repair(timeout=120)
                repaired["at"] = time.time()

            worker = threading.Thread(target=repair)
            worker.start()
        ended = ray.get(waiting, timeout=gloo_timeout + 120)
        out["out"] = max(e.get("out", e.get("at", 0.0)) for e in ended) - started
        out["why"] = ended[0].get("why", "completed")
        if not plain:
            worker.join()
            again = [r not in repaired["ranks"] for r in range(8)]
            refs = [a.form.remote(again=again[r]) for r, a in enumerate(group.actors)]
            ray.get(refs, timeout=120)
            sums = group.execute("reduce")
            out["next"] = max(s["at"] for s in sums) - started
            out["repaired"] = repaired["ranks"]
            assert {s.get("sum") for s in sums} == {8.0}, sums
        return out
    finally:
        undo()
        group.shutdown()
        ctl.release(res.job)
        cluster.add_node(num_cpus=GPUS, num_gpus=GPUS)  # a free node for the next trial
        cluster.wait_for_nodes()


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--scenarios", default="hung,stopped,killed")
    ap.add_argument("--gloo-timeout", type=float, default=30.0)
    args = ap.parse_args()
    results = Results("collective", args)
    with local_cluster(3, gpus=GPUS, log_level="ERROR") as (cluster, _):
        ctl = clients.connect()
        try:
            for scenario in args.scenarios.split(","):
                got = {m: trial(cluster, ctl, scenario, m, args.gloo_timeout)
                       for m in ("gloo", "guarded")}  # fmt: skip
                base = f"{scenario}: gloo alone, survivors out"
                results.add(base, [got["gloo"]["out"]], why=got["gloo"]["why"])
                results.add(f"{scenario}: guarded, survivors out", [got["guarded"]["out"]],
                            baseline=base, why=got["guarded"]["why"])  # fmt: skip
                g = got["guarded"]
                results.add(f"{scenario}: guarded, the next all-reduce of all eight",
                            [g["next"]], repaired=g["repaired"])  # fmt: skip
                print(f"{scenario}: gloo alone out after {got['gloo']['out']:.2f}s "
                      f"({got['gloo']['why'][:80]}); guarded out after "
                      f"{got['guarded']['out']:.2f}s, the next all-reduce after "
                      f"{got['guarded']['next']:.2f}s", flush=True)  # fmt: skip
        finally:
            ctl.release_all()
    results.write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
