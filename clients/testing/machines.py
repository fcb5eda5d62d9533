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
    """The node dies at once: every process killed, nobody told."""
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
