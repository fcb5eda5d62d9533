"""What a worker leaves behind on its node, found and ended from the node's own process
table; no Ray here (it runs in a task on the node, and in the tests).

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

if TYPE_CHECKING:  # the node-side sweep imports nothing of the controller
    from controller.runtime.io import ClusterIO

log = logging.getLogger("placectl.controller")

TAG = "PLACECTL_WORKER"
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
    tags: Iterable[str], proc: str = "/proc", prefixes: Iterable[str] = ()
) -> dict[int, tuple[str, str]]:
    """pid -> (tag, command line) of every live process whose environment holds one of
    ``tags``, or a tag that starts with one of ``prefixes`` (this process excepted)."""
    wanted = {f"{TAG}={t}".encode() for t in tags}
    starts = tuple(f"{TAG}={p}".encode() for p in prefixes)
    found: dict[int, tuple[str, str]] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        env = _read(f"{proc}/{entry}/environ").split(b"\0")
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
    tags: list[str], ray_grace: float = RAY_GRACE_S, prefixes: list[str] = ()
) -> list[Ended]:
    """SIGKILL every process carrying one of ``tags`` (or a tag starting with one of
    ``prefixes``) that is not a Ray worker, until none is left; wait (at most
    ``ray_grace``) for the tagged Ray workers to go, ending what they start meanwhile.
    The processes ended."""
    ended: dict[int, Ended] = {}
    deadline = time.monotonic() + ray_grace
    while True:
        found = tagged(tags, prefixes=prefixes)
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
