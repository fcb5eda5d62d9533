"""The embedded local cluster of ``scripts/job/train.py`` (a head and GPU nodes of 2 fake
GPUs, or a running cluster given by address), the faults a run's schedule names
(``--faults``), and the machine faults train.py strikes it with, as real machines fail:
processes killed, a node stopped, a drain with a deadline, SIGTERM to a node."""

from __future__ import annotations

import contextlib
import signal
import time

from clients.testing import machines
from clients.testing.local import local_cluster

GPU_NODES, GPUS = 5, 2

KINDS = (
    "node",
    "crash",
    "hang",
    "raylet",
    "oom",
    "stall",
    "drain",
    "spot",
    "driver",
    "controller",
    "grow",
    "rollout",
)
# A node is lost or goes: a spare joins after.
NODE_FAULTS = ("node", "crash", "hang", "raylet", "drain", "spot", "rollout")


def parse_faults(text: str, steps: int) -> list[tuple[str, int]]:
    """``node@5,driver@9`` -> [("node", 5), ("driver", 9)], checked."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, _, at = part.partition("@")
        if kind not in KINDS or not at.isdigit() or not 1 <= int(at) <= steps:
            raise SystemExit(
                f"train.py: error: --faults {part!r}: expected KIND@STEP with KIND one of "
                f"{', '.join(KINDS)} and STEP in 1-{steps}"
            )
        if (kind, int(at)) in out:
            raise SystemExit(f"train.py: error: --faults names {part!r} twice")
        out.append((kind, int(at)))
    if sum(k == "grow" for k, _ in out) > 1:
        raise SystemExit("train.py: error: --faults: grow happens at most once")
    return out


class Cluster:
    """The embedded local cluster, or a running one (no node faults there)."""

    def __init__(
        self,
        address: str | None,
        health_checks: dict | None = None,
        notice: float = 30.0,
        env: dict | None = None,
        gpu_nodes: int = GPU_NODES,
    ) -> None:
        import ray

        self.notice = notice  # seconds between a drain's notice and the node's end
        self.timers: list = []
        self.local = None
        self._stack = contextlib.ExitStack()
        if address is None:
            head = {"num_cpus": 2, "num_gpus": 0, "_system_config": health_checks or {}}
            local = local_cluster(gpu_nodes, gpus=GPUS, head=head, env=env, log_level="ERROR")
            self.local, _ = self._stack.enter_context(local)
            address = self.local.address
        else:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
            self._stack.callback(ray.shutdown)
        self.address = address
        import clients

        self.ctl = clients.connect(address=address)
        self.hung: list = []  # (node, its stopped processes), until Ray reports it dead
        self.resumed: list = []  # hung nodes resumed, until their processes are gone

    def _node(self, node_id: str):
        return next(n for n in self.local.list_all_nodes() if n.node_id == node_id)

    def machine_fault(self, kind: str, data: dict) -> str:
        """Fail the machine or the process the driver named, as it really fails; what
        happened, in words."""
        where = f"{data['node'][:12]}"
        if kind in ("node", "crash"):
            machines.crash(self.local, self._node(data["node"]))
            return f"node {where} of trainer rank {data['rank']} died abruptly"
        if kind == "rollout":
            machines.crash(self.local, self._node(data["node"]))
            return f"node {where} of rollout rank {data['rank']} died abruptly, mid-rollout"
        if kind == "raylet":
            machines.kill_raylet(self._node(data["node"]))
            return f"the raylet of node {where} (trainer rank {data['rank']}) was killed"
        if kind == "hang":
            node = self._node(data["node"])
            self.hung.append((node, machines.hang(node)))
            return f"node {where} of trainer rank {data['rank']} hung (SIGSTOP)"
        if kind == "drain":
            node = self._node(data["node"])
            deadline = time.time() + self.notice
            machines.drain(data["node"], deadline, "spot notice")
            self._at(deadline, lambda: machines.crash(self.local, node))
            return (
                f"node {where} of trainer rank {data['rank']} drained (spot notice): it "
                f"goes in {self.notice:g}s"
            )
        if kind == "spot":
            machines.evict(self.local, self._node(data["node"]), grace=self.notice)
            return (
                f"node {where} of trainer rank {data['rank']} got SIGTERM (its pod evicted): "
                f"Ray drains it for {self.notice:g}s"
            )
        sig = signal.SIGKILL if kind == "oom" else signal.SIGSTOP
        machines.signal_pid(data["pid"], sig)
        return f"trainer rank {data['rank']}'s worker (pid {data['pid']}) got {sig.name}"

    def _at(self, when: float, action) -> None:
        """Run ``action`` at wall-clock ``when`` (a node that goes at its deadline)."""
        import threading

        timer = threading.Timer(max(0.0, when - time.time()), action)
        timer.daemon = True
        timer.start()
        self.timers.append(timer)

    def settle(self) -> list[str]:
        """Hung nodes that Ray now reports dead come back (``SIGCONT``) and are refused;
        nodes whose processes all died leave the local cluster. What happened."""
        import ray

        out = []
        dead = {n["NodeID"] for n in ray.nodes() if not n["Alive"]}
        for node, procs in list(self.hung):
            if node.node_id in dead:
                machines.resume(node, procs)
                self.hung.remove((node, procs))
                self.resumed.append(node)
                out.append(f"node {node.node_id[:12]} resumed after Ray declared it dead")
        for node in list(self.resumed):
            if machines.reap(node) and not machines.alive(p.pid for p in machines.processes(node)):
                self.local.remove_node(node, allow_graceful=False)
                self.resumed.remove(node)
                out.append(f"node {node.node_id[:12]} is gone: its raylet exited, told it is dead")
        return out

    def settle_all(self, timeout: float = 180.0) -> list[str]:
        """At the run's end: wait for the hung nodes Ray has yet to declare dead (Ray's
        own health checks: about a minute after the SIGSTOP with its defaults, and the
        steps after the hang may take less), then settle them as during the run; what
        happened. A node still hung after ``timeout`` is said, not waited for."""
        out = self.settle()
        start, said = time.monotonic(), 0
        while (self.hung or self.resumed) and time.monotonic() - start < timeout:
            waited = time.monotonic() - start
            if waited >= said + 10:  # progress on a long wait
                said = int(waited)
                print(f"   waiting for Ray to give up {len(self.hung)} hung node(s): {said}s")
            time.sleep(0.5)
            out += self.settle()
        if self.hung or self.resumed:
            out.append(
                f"{len(self.hung)} hung node(s) not declared dead by Ray, "
                f"{len(self.resumed)} resumed node(s) not gone, after {timeout:.0f}s"
            )
        return out

    def add_spare(self) -> None:
        self.local.add_node(num_cpus=GPUS, num_gpus=GPUS)

    def kill_controller(self) -> None:
        import ray

        ray.kill(self.ctl.handle, no_restart=False)

    def close(self) -> None:
        for timer in self.timers:
            timer.cancel()
        self._stack.close()
