"""Which ranks of a worker group are gone: the verdict on each, before anything relaunches.

Ray calls a worker alive until it learns otherwise: at once when a worker process dies
on a live node, but only after its health checks give up (about a minute with Ray's
defaults for a silent node) when the whole node dies abruptly, hangs or is cut off.
Meanwhile there is evidence on two levels, and :func:`settle` reads both:

* the **node**: the controller's verdict on each node of the job (``verdicts``:
  :mod:`controller.state.verdicts`), which suspects a node silent to it and to its
  witnesses (the job's slot there moves: ``suspected``, then ``moved``) and fences a
  node whose death is proven (``dead``);
* the **rank**: whether its worker process answers a health check
  (:func:`controller.surface.answers`).

A rank's verdict is final when Ray reports it dead; when its node's is ``moved`` (its
slot left the node: it is lost, and relaunched where the slot went); when it answers on
a node that is ``alive``, ``silent`` or ``unknown``; when it refuses placectl's
credentials (``denied``: nothing known of the process) on a node the controller calls
alive, since Ray learns at once of a process that dies on a live node. A rank is *lost*
when its node is dead or moved, or its process refuses connections (nothing listens
there): even while its process still answers, or while Ray calls it alive. On a dead
node :func:`settle` waits for Ray's actor table to agree, at most ``lost_within``
seconds, since nothing can be relaunched before.

No rank is reported not lost before the truth is known: a rank silent on a node with no
verdict yet (``silent``, ``suspected``, ``unknown``: a cut-off node, or a controller that
suspects itself) is waited for until its node has one, and if none comes within
``lost_within`` seconds :func:`settle` raises :class:`UndecidedNodes`, naming the nodes.
Only a rank silent on a node the controller calls alive is hung after ``within`` seconds.

A worker that is only slow (a long step, a loop holding the GIL, a GC pause) answers
from its RPC threads and is never a suspect.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import ray

from clients.ray_state import actor_entry
from controller.errors import ReservationTimeout, UndecidedNodes
from controller.state import verdicts as vd
from controller.state.verdicts import ALIVE, DEAD, GONE, MOVED
from controller.surface import DENIED, DOUBT_WAYS, OK, REFUSED, answers

ANSWER_TIMEOUT_S = 1.0
# How long a look at the controller's verdicts waits for one to change: as long as a
# silent rank takes to be asked, so the two looks of a round end together.
NODE_WAIT_S = ANSWER_TIMEOUT_S
POLL_S = 0.2  # a round's least length, where the controller answers at once
ASKING_THREADS = 8  # the nodes whose ranks are asked at once (each ask is one round trip)
# A node verdict that decides its ranks whatever they answer: the slot moved (lost), the
# node dead (lost once Ray's table agrees), or suspected (its slot moves next).
DECIDED = (MOVED, DEAD, vd.SUSPECTED)
_told_denied: set[str] = set()  # the refusals this process has reported already


def actor_dead(actor: Any) -> bool:
    """Whether Ray's actor table says the actor is dead (one GCS round trip)."""
    entry = actor_entry(actor)
    return not entry or entry.get("State") == "DEAD"


def rank_answers(
    actors: Sequence[Any], timeout: float = ANSWER_TIMEOUT_S, doubted: Sequence[bool] = ()
) -> dict[int, str]:
    """Whether each of ``actors`` answers now, by index: ``ok``, ``silent``, ``denied``
    (it refuses placectl's credentials: said once, as a warning), or ``refused`` (also
    for a missing actor, ``None``, and one Ray does not list alive with a port: there is
    no process to ask). One health check each, all at once; over several connections
    for those ``doubted`` (by index: asked before, without an answer), as the controller
    asks a node in doubt: over a lossy link one connection may stall for seconds behind
    a lost packet, and a rank that answers is not hung."""
    addresses: dict[str, str] = {}
    out: dict[int, str] = {}
    for i, actor in enumerate(actors):
        entry = actor_entry(actor) if actor is not None else {}
        address = entry.get("Address") or {}
        if entry.get("State") != "ALIVE" or not address.get("Port"):
            out[i] = REFUSED  # dead, restarting, or not started yet
            continue
        addresses[str(i)] = f"{address['IPAddress']}:{address['Port']}"
    why: dict[str, str] = {}
    ways = {str(i): DOUBT_WAYS for i, d in enumerate(doubted) if d}
    out.update({int(i): a for i, a in answers(addresses, timeout, why, ways).items()})
    for reason in set(why.values()) - _told_denied:
        _told_denied.add(reason)
        warnings.warn(
            f"a worker refuses placectl's health checks ({reason}): placectl cannot tell a "
            "hung worker from a busy one there, and leaves the verdict to Ray and to the "
            "controller's verdict on its node. Its calls carry the cluster's token and TLS "
            "settings as Ray's clients do: check them in this process's environment",
            stacklevel=2,
        )
    return out


def looks(
    controller: Any, job: str, nodes: Sequence[str], seen: dict[str, str]
) -> Callable[[], Mapping[str, str]]:
    """What :func:`settle` asks of the controller (``controller.verdicts``): the verdict
    on each node of ``job`` and of ``nodes``, gathered into ``seen`` (a node that left the
    job keeps its last one). The first look asks the raylets now; each next one waits for
    a verdict to change (a suspect's slot moved) at most as long as a silent rank takes
    to be asked, so a move is acted on milliseconds after it is made."""
    last: list[dict[str, str]] = []  # the controller's last answer, once there is one

    def ask() -> Mapping[str, str]:
        held = last[0] if last else None
        got = controller.verdicts(job, list(nodes), held, NODE_WAIT_S if last else 0.0)
        last[:] = [got]
        seen.update(got)
        return seen

    return ask


def judge(
    actors: Sequence[Any],
    nodes: Sequence[str],
    reservation: Any,
    dead: Callable[[], set[int]],
    within: float,
    kill_hung: bool,
    say: Callable[[str], None],
    lost_within: float | None = None,
) -> dict[str, str]:
    """Wait for a final verdict on every rank of ``actors`` (one per rank, on ``nodes``;
    :func:`settle`) and kill the ones hung on a live node if ``kill_hung``: what
    ``WorkerGroup.repair`` does before it relaunches anything. Returns the controller's
    last verdict on each node (a node whose ranks moved off it is swept by the
    controller when it answers again, not by the driver).

    Raises:
        UndecidedNodes: a node of a silent rank had no verdict within ``lost_within``.
    """
    live = [r for r, a in enumerate(actors) if a is not None]
    asked: set[int] = set()
    seen: dict[str, str] = {}
    ask_nodes = looks(reservation.controller, reservation.job, nodes, seen)

    def ask_ranks(ranks: list[int]) -> dict[int, str]:
        got = rank_answers([actors[r] for r in ranks], doubted=[r in asked for r in ranks])
        asked.update(ranks)
        return {ranks[i]: a for i, a in got.items()}

    hung = settle(
        live,
        nodes,
        ask_nodes=ask_nodes,
        ask_ranks=ask_ranks,
        dead=dead,
        within=within,
        say=say,
        lost_within=lost_within,
    )
    if hung and kill_hung:
        job = reservation.job
        say(f"{job}: ranks {hung} silent for {within:g}s on live nodes: killed as hung")
        kill([actors[r] for r in hung])
    return dict(seen)


def judge_group(
    actors: Sequence[Any],
    assignments: Sequence[Any],
    reservation: Any,
    dead: Callable[[], set[int]],
    timeout: float,
    hung_after: float | None,
    say: Callable[[str], None],
) -> dict[str, str]:
    """:func:`judge` as a group's ``repair(timeout, hung_after)`` calls it, its ranks
    started with ``assignments``: a rank silent on a live node for ``hung_after``
    seconds is killed as hung (never, with None), and a node waits at most ``timeout``
    for its verdict. Returns the verdict on each node."""
    return judge(
        actors,
        [a.placement.node_id for a in assignments],
        reservation,
        dead=dead,
        within=min(hung_after or 10.0, timeout),
        kill_hung=hung_after is not None,
        say=say,
        lost_within=timeout,
    )


def final(answer: str | None, node: str) -> bool:
    """Whether a rank whose worker gave ``answer`` on a node with the controller's
    verdict ``node`` needs no more waiting (Ray's own report of its death aside)."""
    if node == DEAD:
        return False  # lost, even if its process still answers: Ray's table must agree
    if node == MOVED:
        return True  # lost: its slot left the node; relaunched where the slot went
    if answer == OK:
        # On a node silent to the controller, or suspected, the verdict is still to
        # come: its slot may move though the rank answers again (a link back a moment
        # before the suspicion), and a rank reported kept would then be lost behind
        # the driver's back. On ``unknown`` only Ray's verdict comes: the answer stands.
        return node not in (vd.SILENT, vd.SUSPECTED)
    return answer == DENIED and node == ALIVE  # Ray knows at once if it died there


def lost(answer: str | None, node: str) -> bool:
    """Whether such a rank is gone for certain (its node dead or its slot moved off it,
    or nothing listening where its process was)."""
    return node in GONE or answer == REFUSED


def away(verdicts: Mapping[str, str]) -> set[str]:
    """The nodes of ``verdicts`` a driver leaves alone: the job's slots moved off them
    while they are away (the controller ends what its ranks left there when they answer
    again, or they are fenced); nothing sent there can arrive."""
    return {n for n, v in verdicts.items() if v == MOVED}


def undecided(answer: str | None, node: str) -> bool:
    """Whether such a rank waits on its node's verdict (not on Ray's table, not hung)."""
    return not lost(answer, node) and node != ALIVE


def settle(
    ranks: list[int],
    nodes: Sequence[str],
    ask_nodes: Callable[[], Mapping[str, str]],
    ask_ranks: Callable[[list[int]], Mapping[int, str]],
    dead: Callable[[], set[int]],
    within: float,
    say: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    lost_within: float | None = None,
) -> list[int]:
    """Wait until every rank of ``ranks`` has a final verdict (:func:`final`) or Ray
    reports it dead. Returns the hung ranks: those silent (or refusing connections)
    ``within`` seconds on a node the controller calls alive. Lost ranks (:func:`lost`)
    wait for Ray's table at most ``lost_within`` (default ``within``) seconds; ranks on a
    node with no verdict yet wait as long for one. ``ask_nodes()`` gives the controller's
    verdict by node id (:mod:`controller.state.verdicts`); ``ask_ranks(ranks)`` each rank's
    answer; ``dead()`` the ranks Ray reports dead.

    Raises:
        UndecidedNodes: ranks still wait on their nodes' verdicts after ``lost_within``:
            nothing is known of them, so none is reported lost or kept.
    """
    lost_within = within if lost_within is None else lost_within
    started = clock()
    left = sorted(ranks)
    said = False
    verdicts: Mapping[str, str] = {}
    got: dict[int, str] = {}
    hung: list[int] = []

    def node_of(r: int) -> str:
        return verdicts.get(nodes[r], ALIVE)

    # The ranks are asked on threads of their own, a node's ranks together, while the
    # controller is asked for its verdicts: a silent rank takes a second to time out, and
    # neither a verdict that decides it (its slot moved) nor the answers of the ranks on
    # other nodes are kept waiting for that second.
    asking = ThreadPoolExecutor(ASKING_THREADS, thread_name_prefix="placectl-ranks")
    try:
        while left:
            # A round looks first, then asks the ranks the verdicts leave open: a worker
            # that outlives its raylet for a moment is never taken for kept when its
            # node's death is already known.
            began = clock()
            before, verdicts = dict(verdicts), ask_nodes()
            by_node: dict[str, list[int]] = {}
            for r in left:
                if node_of(r) not in DECIDED:
                    by_node.setdefault(nodes[r], []).append(r)
            pending = {asking.submit(ask_ranks, rs): rs for rs in by_node.values()}
            # Ranks that answer do so in milliseconds: the controller is looked at again
            # only while some have not, until the ones it does not decide have.
            wait(list(pending), timeout=POLL_S)
            while True:
                owed = [
                    f for f, rs in pending.items()
                    if not f.done() and node_of(rs[0]) not in DECIDED
                ]  # fmt: skip
                if not owed:
                    break
                looked = clock()
                verdicts = ask_nodes()
                if clock() - looked < POLL_S:  # a controller that answers at once
                    wait(owed, timeout=POLL_S)
            asked: set[int] = set()
            for f, rs in pending.items():
                if f.done():  # the others' nodes decide their ranks now
                    got.update(f.result())
                    asked.update(rs)
            gone = dead()
            left = [r for r in left if r not in gone]
            left = [r for r in left if not final(got.get(r), node_of(r))]
            waited = clock() - started
            # Hung: silent on a live node when asked just now (an older answer may
            # predate the node's verdict).
            hung = [
                r for r in left
                if r in asked and node_of(r) == ALIVE and got.get(r) not in (OK, DENIED)
            ]  # fmt: skip
            unasked = [r for r in left if r not in asked and node_of(r) not in DECIDED]
            waiting = [r for r in left if r not in hung or waited < within]
            if not left or not waiting:
                break
            if waited >= max(within, lost_within) and not unasked:
                break
            if not said and waited >= 1.0:
                what = {r: f"{got.get(r)}, node {node_of(r)}" for r in left}
                say(f"ranks {left} have no verdict yet ({what}); waiting up to {lost_within:g}s")
                said = True
            if verdicts == before:  # a changed verdict is acted on at once
                sleep(max(POLL_S - (clock() - began), 0.0))
    finally:
        asking.shutdown(wait=False, cancel_futures=True)  # a late answer decides nothing
    stuck = [r for r in left if undecided(got.get(r), node_of(r))]
    if stuck:
        where = sorted({nodes[r] for r in stuck})
        told = ", ".join(f"{n[:12]} ({verdicts.get(n, ALIVE)})" for n in where)
        raise UndecidedNodes(
            f"ranks {stuck} have no verdict after {clock() - started:.1f}s: their node(s) "
            f"{told} neither answer nor are judged; nothing was relaunched or killed. Try "
            "again later: placectl suspects a silent node once witnesses agree, and fences "
            "it on proof or after its grace",
            where,
        )
    return hung


@ray.remote(num_cpus=0, max_retries=0)
def _kill_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def kill(actors: Sequence[Any], within: float = 10.0) -> None:
    """Kill hung actors and wait until Ray reports them dead. A stopped process does
    not take Ray's polite kill, so its node is asked to ``SIGKILL`` its pid too."""
    pids = {}
    for actor in actors:
        entry = actor_entry(actor)
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


def wait_placed(
    reservation: Any,
    component: str,
    since: int,
    verdicts: Mapping[str, str],
    timeout: float,
    progress: Callable[[str], None] | None = None,
) -> None:
    """Until ``reservation`` is ready, or repaired in part: degraded at an epoch after
    ``since`` with none of ``component``'s slots on a node Ray reports dead or one the
    ``verdicts`` found not alive. A repair places what it can (another component's lost
    node may wait for a node to join, its ranks running short), and a group whose own
    slots are placed need not wait for the rest.

    Raises:
        ReservationTimeout: neither within ``timeout``.
    """
    bad = {n for n, v in verdicts.items() if v != ALIVE}
    say = progress or (lambda m: print(f"placectl: {m}", file=sys.stderr, flush=True))
    started = time.monotonic()
    deadline, next_say = started + timeout, started + 10.0
    while True:
        left = deadline - time.monotonic()
        try:  # its own progress is quiet: each wait is short
            reservation.wait_ready(max(min(left, 2.0), 0.1), progress=lambda _m: None)
            return
        except ReservationTimeout:
            info = reservation.info
            if info.state == "degraded" and info.epoch > since:
                own = reservation.assignments(component, allow_degraded=True)
                nodes = {a.placement.node_id for a in own}
                if not nodes & bad and not reservation.controller.dead_nodes(nodes):
                    return
            now = time.monotonic()
            why = info.reason or info.state
            if now >= deadline:
                raise ReservationTimeout(
                    f"reservation {reservation.job!r} is not ready after {timeout:g}s: it is "
                    f"{info.state} ({why})"
                ) from None
            if now >= next_say:
                label = f"{reservation.job}/{component}"
                say(f"{label}: waiting {now - started:.0f}s for its slots: {why}")
                next_say = now + 10.0
