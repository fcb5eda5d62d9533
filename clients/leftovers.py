"""What a worker leaves behind on its node, and ending it before the slot is used again.

An inference engine started inside a rank (vLLM's engine core and workers, SGLang's
scheduler, a server launched with ``subprocess``) is a tree of plain OS processes. When
the rank ends, Ray ends what it knows: the worker, the actors it owns, and the processes
still in the worker's process group. A process that left the group (a new session, as a
daemon or a ``start_new_session=True`` launcher makes) outlives the rank and keeps its
device memory and ports, so the engine relaunched in the same slot cannot start.

placectl tags every worker it starts with ``PLACECTL_WORKER`` in its environment, which
every process the worker starts inherits (unless it clears its environment), whatever
session or parent it ends up with. When a worker is stopped (relaunched by ``repair()``,
``restart()``, a move, ``shutdown()``), placectl runs one task on the worker's node that
ends every process still carrying the tag, before a new worker is started there. Ray's
own workers carrying it (the stopped worker, its child actors) are Ray's to end; the
task waits for them rather than killing them.

A node Ray is draining takes no new task (Ray 2.60: ``TaskUnschedulableError``), and a
drain is when ranks move off a node that lives on until its deadline. So a worker about
to be stopped on a draining node first ends what it started itself, from inside its
own process (:func:`end_from_inside`), while it still runs.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable, Iterable

import msgspec

TAG = "PLACECTL_WORKER"
# How long a stopped worker's Ray processes get to go before the sweep returns anyway.
RAY_GRACE_S = 5.0
SWEEP_TIMEOUT_S = 15.0


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


def tagged(tags: Iterable[str], proc: str = "/proc") -> dict[int, tuple[str, str]]:
    """pid -> (tag, command line) of every live process whose environment holds one of
    ``tags`` (this process excepted)."""
    wanted = {f"{TAG}={t}".encode() for t in tags}
    found: dict[int, tuple[str, str]] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        hit = wanted.intersection(_read(f"{proc}/{entry}/environ").split(b"\0"))
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
    """A Ray worker process (its title is ``ray::...``): Ray ends those itself."""
    return command.startswith("ray::")


def end_tagged(tags: list[str], ray_grace: float = RAY_GRACE_S) -> list[Ended]:
    """SIGKILL every process carrying one of ``tags`` that is not a Ray worker, until none
    is left; wait (at most ``ray_grace``) for the tagged Ray workers to go, ending what
    they start meanwhile. The processes ended."""
    ended: dict[int, Ended] = {}
    deadline = time.monotonic() + ray_grace
    while True:
        found = tagged(tags)
        for pid, (tag, cmd) in found.items():
            if is_ray_worker(cmd):
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                ended.setdefault(pid, Ended(pid, cmd, tag))
        if not found or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return sorted(ended.values(), key=lambda e: e.pid)


def draining_nodes() -> set[str]:
    """The nodes Ray is draining now (empty when the GCS cannot say)."""
    import ray

    try:
        gcs = ray._private.worker.global_worker.gcs_client  # as `ray drain-node` does
        return set(gcs.get_draining_nodes(timeout=10))
    except Exception:
        return set()


def _end_own(_actor: object, tag: str) -> list[Ended]:
    """Run inside a worker (``__ray_call__``): end the processes carrying its tag but
    itself and Ray's workers."""
    return end_tagged([tag], ray_grace=0.0)


def end_from_inside(
    workers: list[tuple[object, str, str]],
    say: Callable[[str], None] | None = None,
    timeout: float = SWEEP_TIMEOUT_S,
) -> list[Ended]:
    """Have each worker (``(actor, tag, node)``), still running, end what it started,
    all at once; one that does not reply within ``timeout`` (busy in a call, hung) is
    named and skipped."""
    import ray

    say = say or (lambda m: print(f"placectl: {m}", file=sys.stderr, flush=True))
    refs = {actor.__ray_call__.remote(_end_own, tag): node for actor, tag, node in workers}
    if not refs:
        return []
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
    ended: list[Ended] = []
    for ref, node in refs.items():
        try:
            found = ray.get(ref) if ref in ready else None
        except Exception:  # the worker died meanwhile: the sweep after it has its chance
            found = None
        if found is None:
            say(f"a stopped worker on draining node {node[:12]} did not end its leftovers")
            continue
        for e in found:
            say(f"ended pid {e.pid} ({e.command}) on node {node[:12]}: left by {e.tag}")
        ended += found
    return ended


def end_left_behind(
    by_node: dict[str, list[str]],
    say: Callable[[str], None] | None = None,
    timeout: float = SWEEP_TIMEOUT_S,
) -> list[Ended]:
    """On each live node of ``by_node`` (node id -> tags), end the tagged processes (one
    task per node, all at once). A node Ray reports dead is skipped (its processes went
    with it); one that does not answer within ``timeout`` is named and skipped."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    say = say or (lambda m: print(f"placectl: {m}", file=sys.stderr, flush=True))
    live = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    sweep = ray.remote(num_cpus=0, max_retries=0)(end_tagged)
    refs = {
        node: sweep.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
        ).remote(sorted(tags))
        for node, tags in by_node.items()
        if tags and node in live
    }
    ended: list[Ended] = []
    if not refs:
        return ended
    _, pending = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)
    for node, ref in refs.items():
        if ref in pending:
            say(
                f"node {node[:12]} did not answer within {timeout:g}s; what its stopped "
                "workers started there is left as it is"
            )
            continue
        try:
            found = ray.get(ref)
        except Exception as e:  # the node went meanwhile: nothing is left there
            if not isinstance(e, ray.exceptions.TaskUnschedulableError):  # draining: done
                say(f"could not look for leftovers on node {node[:12]}: {type(e).__name__}")
            continue
        for e in found:
            say(f"ended pid {e.pid} ({e.command}) on node {node[:12]}: left by {e.tag}")
        ended += found
    return ended
