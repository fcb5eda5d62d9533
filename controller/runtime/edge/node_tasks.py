"""Tasks that run inside the cluster: the accelerator probe, the warm-up, the port
check, the witness and the leftovers' sweep. Kept light (Ray and msgspec; the edge's
package imports its records' types for annotations only), because every node's probe
worker imports this module: a lighter import is a faster first probe.

**Leftovers.** What a worker leaves behind on its node, found and ended from the
node's own process table (in a task on the node, and in the tests).

An inference engine started inside a rank (vLLM's engine core and workers, SGLang's
scheduler, a server launched with ``subprocess``) is a tree of plain OS processes. When
the rank ends, Ray ends what it knows: the worker, the actors it owns, the processes
still in the worker's process group, and, when the worker exits rather than being killed
by a signal, its direct children. A daemon (double-forked into a session of its own)
outlives the rank either way, as does a child of a killed worker, and keeps its device
memory and ports, so the engine started next in the same slot cannot start.

placectl tags every worker it starts with ``PLACECTL_WORKER=<reservation uid>:<name>``
in its environment, which every process the worker starts inherits (unless it clears its
environment), whatever session or parent it ends up with. The client ends a stopped
rank's tag (:mod:`clients.slot_sweep`); the controller, on ``release``, every tag of the
reservation on each node it held (:func:`reservation_prefix`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import msgspec
import ray


def _nvidia_identity(ids: list[int]) -> tuple[list[str], list[str]]:
    """UUID and PCI bus id of each NVIDIA device in ``ids`` (physical indices), from
    ``nvidia-smi``, which ignores CUDA_VISIBLE_DEVICES; empty where it is absent."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if not ids or exe is None:
        return [], []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return [], []
    table = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            table[int(parts[0])] = (parts[1], parts[2])
    if not all(i in table for i in ids):
        return [], []
    return [table[i][0] for i in ids], [table[i][1] for i in ids]


@ray.remote(num_cpus=0, max_calls=0, max_retries=0)
def probe(accelerator: str) -> dict:
    """The physical ids of ``accelerator`` this task was given, sorted as ints, and on
    NVIDIA nodes the identity of each device."""
    raw = ray.get_runtime_context().get_accelerator_ids().get(accelerator, [])
    ids = sorted(int(i) for i in raw)
    uuids, buses = _nvidia_identity(ids) if accelerator == "GPU" else ([], [])
    return {"ids": ids, "uuids": uuids, "pci_bus_ids": buses}


@ray.remote(num_cpus=0, max_calls=0, max_retries=0)
def warm() -> None:
    """Nothing: running it starts (or keeps) an idle worker on the node."""


@ray.remote(num_cpus=0, max_restarts=0)
class Witness:
    """Kept standing on a few nodes, so that the controller's second opinion on a node
    silent to it (:mod:`controller.runtime.core.evidence`) waits for no process to start."""

    def ask(self, addresses: dict[str, str], timeout: float, ways: int = 1) -> dict[str, str]:
        """Whether the raylets at ``addresses`` answer *this* node, each asked over
        ``ways`` connections at once."""
        from controller.runtime.edge.answers import answers

        return answers(addresses, timeout, ways=ways)


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range on this node (Linux), else IANA's."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split()[:2])
            return low, high
    except (OSError, ValueError):
        return 49152, 65535


@ray.remote(num_cpus=0, max_calls=0, max_retries=0)
def free_ports(candidates: list[int]) -> list[int]:
    """The ports of ``candidates`` (in order) that nothing on this node has bound and that
    lie outside the ephemeral range, where the kernel may hand them to any client."""
    import socket

    low, high = ephemeral_range()
    found = []
    for port in candidates:
        if low <= port <= high:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        found.append(port)
    return found


@ray.remote(num_cpus=0, max_calls=0, max_retries=0)
def end_leftovers(uid: str, ray_workers: bool = False) -> list[str]:
    """End every process on this node that a worker of reservation ``uid`` left (its
    tag), Ray's own workers given their time to go, or, with ``ray_workers``, ended too;
    their command lines."""
    from controller.runtime.edge.node_tasks import end_tagged, reservation_prefix

    prefixes = [reservation_prefix(uid)]
    # Ray's workers, killed here, are this node's only: on a local cluster every node's
    # processes share one process table, told apart by the raylet they belong to.
    mine = f"{RAYLET_PID}={os.environ.get(RAYLET_PID, '')}" if ray_workers else None
    ended = end_tagged([], prefixes=prefixes, ray_workers=ray_workers, within=mine)
    return [e.command for e in ended]


if TYPE_CHECKING:  # the node-side sweep imports nothing of the controller
    from controller.runtime.edge import ClusterIO

log = logging.getLogger("placectl.controller")

TAG = "PLACECTL_WORKER"
RAYLET_PID = "RAY_RAYLET_PID"  # in every Ray worker's environment: the raylet it belongs to
# How long a stopped worker's Ray processes get to go before the sweep returns anyway.
RAY_GRACE_S = 5.0
# In the command line of every Ray worker process before it takes its ``ray::`` title
# (default_worker.py; setup_worker.py while a runtime environment is made).
RAY_WORKER_ENTRY = "/ray/_private/workers/"


class Ended(msgspec.Struct, frozen=True):
    """One process a sweep ended: its pid, its command line and the worker it came from."""

    pid: int
    command: str
    tag: str


def new_tag(uid: str, name: str, detached: bool) -> str:
    """The tag of a worker to be started: a detached worker's follows from its name (a
    driver that attaches later finds it again), another's is new each start."""
    return f"{uid}:{name}" if detached else f"{uid}:{name}:{secrets.token_hex(4)}"


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:  # gone, a zombie, or not ours to read
        return b""


def reservation_prefix(uid: str) -> str:
    """What the tag of every worker of reservation ``uid`` starts with."""
    return f"{uid}:"


def tagged(
    tags: Iterable[str],
    proc: str = "/proc",
    prefixes: Iterable[str] = (),
    within: str | None = None,
) -> dict[int, tuple[str, str]]:
    """pid -> (tag, command line) of every live process whose environment holds one of
    ``tags``, or a tag that starts with one of ``prefixes`` (this process excepted), and,
    given ``within`` (``NAME=value``), that entry too."""
    wanted = {f"{TAG}={t}".encode() for t in tags}
    starts = tuple(f"{TAG}={p}".encode() for p in prefixes)
    found: dict[int, tuple[str, str]] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        env = _read(f"{proc}/{entry}/environ").split(b"\0")
        if within is not None and within.encode() not in env:
            continue
        hit = wanted.intersection(env) or {v for v in env if starts and v.startswith(starts)}
        if hit:
            cmd = _read(f"{proc}/{entry}/cmdline").replace(b"\0", b" ").strip()
            tag = hit.pop().decode().partition("=")[2]
            found[int(entry)] = (tag, cmd.decode(errors="replace")[:200])
    return found


def alive(pid: int) -> bool:
    """The process exists and is not a zombie, read from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def is_ray_worker(command: str) -> bool:
    """A Ray worker process: titled ``ray::...`` once it runs a task or an actor, and
    before that (starting, or idle in Ray's pool) Ray's worker entry point. Ray ends
    those itself; killing one that is still starting fails what Ray starts it for."""
    return command.startswith("ray::") or RAY_WORKER_ENTRY in command


def end_tagged(
    tags: list[str],
    ray_grace: float = RAY_GRACE_S,
    prefixes: list[str] = (),
    ray_workers: bool = False,
    within: str | None = None,
) -> list[Ended]:
    """SIGKILL every process carrying one of ``tags`` (or a tag starting with one of
    ``prefixes``) that is not a Ray worker, until none is left; wait (at most
    ``ray_grace``) for the tagged Ray workers to go, ending what they start meanwhile.
    With ``ray_workers``, the tagged Ray workers are killed too: workers whose group Ray
    removed while their node was away, which Ray would end only once its GCS reaches
    the node again. With ``within`` (``NAME=value``), only processes whose environment
    holds it. The processes ended."""
    ended: dict[int, Ended] = {}
    deadline = time.monotonic() + ray_grace
    while True:
        found = tagged(tags, prefixes=prefixes, within=within)
        for pid, (tag, cmd) in found.items():
            if is_ray_worker(cmd) and not ray_workers:
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                ended.setdefault(pid, Ended(pid, cmd, tag))
        if not found or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return sorted(ended.values(), key=lambda e: e.pid)


async def end_on_nodes(
    io: ClusterIO, uid: str, job: str, node_ids: set[str], timeout: float
) -> int:
    """End what workers of reservation ``uid`` (job ``job``) left on each live node of
    ``node_ids``, all at once, through ``io``; how many processes ended. A node that
    does not answer within ``timeout`` is named in the log and left as it is: a release
    never waits on it longer, nor fails for it."""
    live = sorted(node_ids - await io.dead_nodes(sorted(node_ids)))

    async def one(node: str) -> int:
        try:
            ended = await asyncio.wait_for(io.end_leftovers(node, uid), timeout)
        except TimeoutError:
            log.warning(
                "node %s did not answer within %gs; what %r's workers left there is left",
                node[:12],
                timeout,
                job,
            )
            return 0
        except Exception as e:  # the node went meanwhile, or is draining: nothing to do
            log.info("no look for %r's leftovers on node %s: %r", job, node[:12], e)
            return 0
        for command in ended:
            log.warning("ended %s on node %s: left by a worker of %r", command, node[:12], job)
        return len(ended)

    return sum(await asyncio.gather(*(one(n) for n in live)))
