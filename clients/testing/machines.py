"""Machines failing as real ones do, on a local cluster (``ray.cluster_utils.Cluster``).

Nothing here is polite: no fault tells Ray first. A node's processes are killed at once
(power loss, kernel panic), or stopped (a hung machine, ``SIGSTOP``) and later resumed
after Ray or placectl has given them up; one worker is killed (the OOM killer) or
stopped; a raylet alone is killed while its workers outlive it for a moment.

A process that exits is reaped here as init reaps it on a real machine: an unreaped
raylet stays a zombie, and its workers, which watch their raylet's pid, would never
notice it died.
"""

from __future__ import annotations

import contextlib
import signal
import time

import psutil
from ray._private import ray_constants

# Ray's health checks of its nodes, tighter than its defaults (period 3 s, timeout 10 s,
# 5 failures): a silent node is declared dead after about 3 s instead of 15 s and more.
# Set on the head (``ray start --head --system-config`` or ``_system_config``).
TIGHT_HEALTH_CHECKS = {
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}


def _raylet(node):
    return node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process


def processes(node) -> list[psutil.Process]:
    """Every process of a node: its raylet, the workers and agents it started, and the
    node's other processes."""
    own = []
    for infos in node.all_processes.values():
        for info in infos:
            with contextlib.suppress(psutil.NoSuchProcess):
                own.append(psutil.Process(info.process.pid))
    kids = []
    for p in own:
        with contextlib.suppress(psutil.NoSuchProcess):
            kids.extend(p.children(recursive=True))
    return list({p.pid: p for p in own + kids}.values())


def crash(cluster, node) -> None:
    """The node dies at once: every process killed, nobody told.

    Its workers are killed with the rest. ``remove_node`` alone kills the raylet and the
    node's agents; a worker then lives on until it next checks its raylet (about a
    second), still answering its peers, which no machine that lost power does."""
    procs = processes(node)
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    # A signal is delivered, not obeyed, when kill() returns: the node is dead once no
    # process of it runs any more (milliseconds; bounded all the same).
    deadline = time.monotonic() + 5.0
    while alive(p.pid for p in procs) and time.monotonic() < deadline:
        time.sleep(0.005)
    cluster.remove_node(node, allow_graceful=False)


def hang(node) -> list[psutil.Process]:
    """Every process of the node stops; returns them, for :func:`resume`."""
    procs = processes(node)
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGSTOP)
    return procs


def resume(node, procs: list[psutil.Process]) -> None:
    """The hung node's processes go on where they stopped."""
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGCONT)


def reap(node) -> bool:
    """Reap the node's raylet if it exited; True if it has."""
    return _raylet(node).poll() is not None


def kill_raylet(node) -> int:
    """Kill the node's raylet alone (its workers outlive it briefly); its pid."""
    raylet = _raylet(node)
    raylet.kill()
    raylet.wait(timeout=30)
    return raylet.pid


def drain(node_id: str, deadline: float, why: str = "spot notice") -> None:
    """What a spot-notice handler or KubeRay does: Ray's PREEMPTION drain of the
    node, ending at wall-clock ``deadline``. The node is not told anything else."""
    import ray
    from ray.core.generated.autoscaler_pb2 import DrainNodeReason

    gcs = ray._private.worker.global_worker.gcs_client  # as `ray drain-node` does
    reason = DrainNodeReason.DRAIN_NODE_REASON_PREEMPTION
    accepted, refusal = gcs.drain_node(node_id, reason, why, int(deadline * 1000))
    if not accepted:
        raise RuntimeError(f"Ray refused to drain node {node_id[:12]}: {refusal}")


def evict(cluster, node, grace: float = 30.0) -> None:
    """What a pod deleted or evicted gets: SIGTERM to its first process, ``ray start
    --block``, on which Ray 2.60 drains the node (PREEMPTION, a deadline ``grace``
    seconds away, ``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S``), waits until its raylet has
    exited (it does once the node is draining and idle) or the deadline, then stops the
    node's processes. The nodes of a ``ray.cluster_utils.Cluster`` are run by this
    process, not by a ``ray start`` of their own, so the same sequence runs here, in the
    background; :class:`clients.testing.autoscaler.ProcessNode` gets the real signal."""
    import threading

    deadline = time.time() + grace
    drain(node.node_id, deadline, "Node received SIGTERM; draining before shutdown.")

    def finish() -> None:
        raylet = _raylet(node)
        while time.time() < deadline and raylet.poll() is None:
            time.sleep(0.2)
        with contextlib.suppress(Exception):
            cluster.remove_node(node, allow_graceful=False)

    threading.Thread(target=finish, name="evicted-node", daemon=True).start()


def alive(pids) -> list[int]:
    """Those of ``pids`` that still run (a zombie does not)."""
    out = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
    return out


def signal_pid(pid: int, sig: int) -> None:
    psutil.Process(pid).send_signal(sig)


def wait_gone(pids, timeout: float = 30.0) -> list[int]:
    """Wait until none of ``pids`` runs; those that still do at the timeout."""
    deadline = time.monotonic() + timeout
    while (left := alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
