"""Which ranks of a worker group are gone: Ray's verdict, and the evidence before it.

Ray calls a worker alive until it learns otherwise: at once when a worker process dies
on a live node, but only after its health checks give up (15 s and more with Ray's
defaults) when the whole node dies abruptly or hangs. Meanwhile the evidence is there:
the worker's process does not answer (:mod:`controller.runtime.answers`). A rank that
does not answer is a *suspect*; :func:`await_verdict` waits, bounded, until each suspect
answers again (it was only slow to) or Ray reports it dead (the controller fences a node
whose raylet is gone, see :mod:`controller.runtime.liveness`), and reports the ones that
stayed silent on a node that lives: stopped or hung processes.

A worker that is only slow (a long step, a loop holding the GIL, a GC pause) answers
from its RPC threads and is never a suspect.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import ray

from controller.runtime.answers import DENIED, OK, answers

ANSWER_TIMEOUT_S = 1.0
_told_denied: set[str] = set()  # the refusals this process has reported already


def _actor_entry(actor: Any) -> dict:
    return ray._private.state.state.actor_table(actor._actor_id.hex()) or {}


def actor_dead(actor: Any) -> bool:
    """Whether Ray's actor table says the actor is dead (one GCS round trip)."""
    entry = _actor_entry(actor)
    return not entry or entry.get("State") == "DEAD"


def unanswered(actors: Sequence[Any], timeout: float = ANSWER_TIMEOUT_S) -> list[int]:
    """The indices of ``actors`` whose process does not answer now (dead ones, and
    missing ones, ``None``, included): one health check each, all at once. A process
    that refuses placectl's credentials is no suspect: that says nothing of whether it
    runs (said once, as a warning); Ray's own verdict decides for it."""
    addresses: dict[str, str] = {}
    gone = []
    for i, actor in enumerate(actors):
        entry = _actor_entry(actor) if actor is not None else {}
        address = entry.get("Address") or {}
        if entry.get("State") != "ALIVE" or not address.get("Port"):
            gone.append(i)  # dead, restarting, or not started yet: no process to ask
            continue
        addresses[str(i)] = f"{address['IPAddress']}:{address['Port']}"
    why: dict[str, str] = {}
    got = answers(addresses, timeout, why)
    for reason in set(why.values()) - _told_denied:
        _told_denied.add(reason)
        warnings.warn(
            f"a worker refuses placectl's health checks ({reason}): placectl cannot tell a "
            "hung worker from a busy one there, and leaves the verdict to Ray. Its calls "
            "carry the cluster's token and TLS settings as Ray's clients do: check them "
            "in this process's environment",
            stacklevel=2,
        )
    return sorted(gone + [int(i) for i, a in got.items() if a not in (OK, DENIED)])


def judge(
    actors: Sequence[Any],
    nodes: Sequence[str],
    reservation: Any,
    dead: Callable[[], set[int]],
    within: float,
    kill_hung: bool,
    say: Callable[[str], None],
) -> None:
    """Find the suspects among ``actors`` (one per rank, on ``nodes``), wait for Ray's
    verdict on them (:func:`await_verdict`), and kill the ones hung on a live node if
    ``kill_hung``: what ``WorkerGroup.repair`` does before it relaunches anything."""
    # The controller asks the raylets first: one that refuses is fenced by this call (a
    # dead node's workers may still answer for a moment after their raylet died).
    silent_nodes = set(reservation.controller.suspects(reservation.job))
    live = [r for r, a in enumerate(actors) if a is not None]
    suspects = [live[i] for i in unanswered([actors[r] for r in live])]
    suspects += [r for r in live if nodes[r] in silent_nodes]
    suspects = sorted(set(suspects) - dead())
    if not suspects:
        return
    hung = await_verdict(
        actors,
        suspects,
        dead=dead,
        ask=lambda: reservation.controller.suspects(reservation.job),
        within=within,
        say=say,
    )
    if hung and kill_hung:
        job = reservation.job
        say(f"{job}: ranks {hung} silent for {within:g}s on live nodes: killed as hung")
        kill([actors[r] for r in hung])


def await_verdict(
    actors: Sequence[Any],
    suspects: list[int],
    dead: Callable[[], set[int]],
    ask: Callable[[], None],
    within: float,
    say: Callable[[str], None],
) -> list[int]:
    """Wait until every suspect rank answers again or Ray reports it dead, at most
    ``within`` seconds; returns the ranks still silent then while Ray calls them
    alive (hung). ``dead()`` gives the ranks Ray reports dead now; ``ask()`` has the
    controller look at the reservation's nodes (it fences a node whose raylet is gone)."""
    started = time.monotonic()
    left = sorted(suspects)
    said = False
    while left:
        ask()
        gone = dead()
        left = [r for r in left if r not in gone]
        if left:
            silent = set(unanswered([actors[r] for r in left]))
            left = [r for i, r in enumerate(left) if i in silent and r not in gone]
        waited = time.monotonic() - started
        if not left or waited >= within:
            break
        if not said and waited >= 1.0:
            say(f"ranks {left} do not answer; waiting up to {within:g}s for Ray's verdict")
            said = True
        time.sleep(0.2)
    return left


@ray.remote(num_cpus=0, max_retries=0)
def _kill_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def kill(actors: Sequence[Any], within: float = 10.0) -> None:
    """Kill hung actors and wait until Ray reports them dead. A stopped process does
    not take Ray's polite kill, so its node is asked to ``SIGKILL`` its pid too."""
    pids = {}
    for actor in actors:
        entry = _actor_entry(actor)
        if entry.get("Pid") and entry.get("Address", {}).get("NodeID"):
            pids[entry["Pid"]] = entry["Address"]["NodeID"]
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    refs = [
        _kill_pid.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
        ).remote(pid)
        for pid, node in pids.items()
    ]
    ray.wait(refs, num_returns=len(refs), timeout=within)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and not all(actor_dead(a) for a in actors):
        time.sleep(0.1)
