"""The machine faults of ``scripts/chaos/chaos.py``: nodes that die without a word, hung nodes
that come back after they were given up, workers killed under a live worker group, and
the invariants they add.

* a node loss is abrupt (every process killed, Ray not told) unless ``graceful``;
* a hung node's processes stop; once Ray reports it dead (placectl fences one holding a
  slot within seconds, Ray's own checks any other), they resume: the node must stay
  dead and never be given a slot;
* a worker group on a ready reservation has one of its workers killed (or none), then
  ``repair()`` must relaunch exactly the dead ranks (killed, or on a dead node) and no
  live one;
* the controller is killed (Ray restarts it), its process killed if Ray drops the kill.
"""

from __future__ import annotations

import os
import signal
import time

import ray

import clients
from clients.testing import machines


def _pinger():
    """A worker class defined here, so that Ray ships it by value to the workers."""

    class Pinger:
        def pid(self) -> int:
            import os

            return os.getpid()

    return Pinger


def wait_until(predicate, timeout: float) -> bool:
    """Poll ``predicate`` every 0.2 s; whether it held within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


class MachineFaults:
    """Machine faults on ``cluster`` (a ``ray.cluster_utils.Cluster``), counted in
    ``faults``, violations appended to ``violations``."""

    def __init__(self, cluster, ctl, rng, faults, violations) -> None:
        self.cluster = cluster
        self.ctl = ctl
        self.rng = rng
        self.faults = faults
        self.violations = violations
        self.returned: set[str] = set()  # hung nodes resumed after Ray gave them up

    def remove(self, node, wait_dead) -> str:
        """Lose a node, abruptly two times in three; wait until Ray reports it dead."""
        abrupt = self.rng.random() < 2 / 3
        self.faults["node killed abruptly" if abrupt else "node removed gracefully"] += 1
        self.cluster.remove_node(node, allow_graceful=not abrupt)
        wait_dead(node.node_id)
        return "killed abruptly" if abrupt else "removed"

    def hang(self, node, wait_dead) -> str:
        """Stop every process of ``node``; resume them once Ray reports it dead."""
        self.faults["node hung, resumed after it was declared dead"] += 1
        stopped = machines.hang(node)
        started = time.monotonic()
        wait_dead(node.node_id)
        took = time.monotonic() - started
        machines.resume(node, stopped)
        deadline = time.monotonic() + 60
        while not machines.reap(node) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.cluster.remove_node(node, allow_graceful=False)  # its processes are gone
        self.returned.add(node.node_id)
        return f"dead after {took:.1f}s, resumed"

    def violations_now(self, table) -> list[str]:
        """A node back from the dead is alive again or holds a slot of a ready one."""
        bad = []
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        bad += [f"node {n[:8]} came back from the dead" for n in self.returned & alive]
        for r in table.values():
            back = {s.node_id for s in r.slots} & self.returned
            if r.state == "ready" and back:
                bad.append(f"{r.job}: ready with a slot on {sorted(back)}, back from the dead")
        return bad

    def workers(self, job: str) -> str:
        """Launch a worker group on ``job``, kill one worker or none, repair: exactly
        the dead ranks come back."""
        try:
            res = self.ctl.reservation(job)
            component = res.components[0]
            group = clients.WorkerGroup.launch(
                res, component, _pinger(), timeout=60, progress=lambda m: None
            )
        except Exception as e:  # released or degraded meanwhile: nothing to check
            return f"workers on {job}: {type(e).__name__}"
        try:
            pids = ray.get([a.pid.remote() for a in group.actors], timeout=60)
            killed = []
            if self.rng.random() < 0.7:
                killed = [self.rng.randrange(len(pids))]
                self.faults["worker killed (SIGKILL)"] += 1
                machines.signal_pid(pids[killed[0]], signal.SIGKILL)
            on_dead = set(group.dead_ranks()) - set(killed)
            try:
                relaunched = group.repair(timeout=120, hung_after=None, progress=lambda m: None)
            except clients.PlacementError as e:  # released or preempted meanwhile
                return f"workers on {job}: {type(e).__name__} at repair"
            now = ray.get([a.pid.remote() for a in group.actors], timeout=60)
            live = [r for r in range(len(pids)) if r not in killed and r not in on_dead]
            touched = [r for r in live if r in relaunched or now[r] != pids[r]]
            if touched:
                self.violations.append(f"workers on {job}: live ranks {touched} relaunched")
            missing = sorted(set(killed) - set(relaunched))
            if missing:
                self.violations.append(f"workers on {job}: dead ranks {missing} not relaunched")
            return f"workers on {job}/{component}: killed {killed}, relaunched {relaunched}"
        except Exception as e:
            self.violations.append(f"workers on {job}: {type(e).__name__}: {e}")
            return f"workers on {job}: failed"
        finally:
            group.shutdown()

    def kill_controller(self) -> None:
        """Kill the controller (Ray restarts it). After a GCS restart Ray 2.60 may drop
        the kill ("Not sending KillLocalActorRequest because Actor has not been assigned
        a lease"): then its process is killed instead, as a crash would."""
        before = self._controller_pid()
        ray.kill(self.ctl.handle, no_restart=False)
        if wait_until(lambda: self._controller_pid() != before, 10):
            return
        self.faults["Ray dropped a kill: process killed"] += 1
        if before:
            os.kill(before, signal.SIGKILL)

    @staticmethod
    def _controller_pid() -> int:
        for a in ray._private.state.state.actor_table(None).values():
            if a.get("Name") == "placectl" and a.get("State") == "ALIVE":
                return int(a.get("Pid") or 0)
        return 0
