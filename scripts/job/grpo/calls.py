"""The driver's remote calls: waiting on a step's calls, with a deadline and the first
error at once, and saying an error in one line."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import ray

import clients


class StepTimeout(Exception):
    """A step's calls did not all finish within the job's deadline."""


def cause_of(error: BaseException) -> str:
    """An error in one line: its type and the first line of what went wrong; for a remote
    call's error, the worker's own error (Ray's text starts with the call and its
    traceback)."""
    inner = (
        getattr(error, "cause", None) if isinstance(error, ray.exceptions.RayTaskError) else None
    )
    if isinstance(inner, BaseException):
        return f"{type(error).__name__}: {cause_of(inner)}"
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    return f"{type(error).__name__}: {(lines or [''])[0][:160]}"


def gather(refs: list, timeout: float | None = None) -> list:
    """Every result, in order, once all are done. The first error as soon as one call
    fails (a survivor blocked on a dead peer is not waited for), and
    :class:`StepTimeout` if they are not all done within ``timeout``."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pending = list(refs)
    while pending:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise StepTimeout(f"{len(pending)} of {len(refs)} calls unfinished after {timeout:g}s")
        done, pending = ray.wait(pending, num_returns=1, timeout=left)
        for ref in done:
            ray.get(ref)  # raises the call's error now
    return ray.get(refs)


def split(items: list, parts: int) -> list[list]:
    """``items`` in ``parts`` contiguous shards, as even as can be."""
    size, extra = divmod(len(items), parts)
    out, at = [], 0
    for p in range(parts):
        n = size + (p < extra)
        out.append(items[at : at + n])
        at += n
    return out


def standing(groups: dict) -> dict[str, set]:
    """The Ray actor ids of each worker group's standbys (``standby: true``) now."""
    return {n: {a._actor_id for a in g.standbys} for n, g in groups.items()}


def promoted(groups: dict, relaunched: dict[str, list[int]], before: dict[str, set]) -> dict:
    """Of the ranks a repair returned, those whose actor is one of the standbys of
    ``before``: promoted, not started (read from Ray's actor ids, not placectl's word)."""
    out = {}
    for n, ranks in relaunched.items():
        same = [r for r in ranks if groups[n].actors[r]._actor_id in before.get(n, set())]
        if same:
            out[n] = same
    return out


def warm_standbys(res, groups: dict, spec: dict) -> None:
    """With held spares (``--standby``): once the spare is held and every standby has
    started (an engine's takes a core for 20 s here). The job trains after this, so a
    fault finds its standbys warm, as one does in a job that has run for a while."""
    if not spec.get("spares"):
        return
    deadline = time.monotonic() + 300
    while len(res.refresh().spares) < spec["spares"]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{spec['spares']} spare node(s) not held within 300 s")
        time.sleep(0.2)
    for group in groups.values():
        group.refill_standbys()
    gather([a.__ray_ready__.remote() for g in groups.values() for a in g.standbys], 600)


def publish(groups: dict, version: int, lost: Callable[[], None] | None = None) -> list[int]:
    """The job's weight push: the ready replacements of rollout ranks lost meanwhile
    (``on_loss: continue``) are admitted first, then every live rollout rank takes
    trainer rank 0's weights as of step ``version`` and says it holds them
    (``WorkerGroup.push``, :mod:`clients.weights`); a rank generates only for the
    version it holds (a promoted standby or an admitted replacement included, whose
    first weights these are). A rank found gone meanwhile when rollout may run short is
    left to ``lost()`` (default: the group's ``repair()``), and the push goes on; where
    rollout keeps standbys, to the ranks found lost here their promoted standbys, once
    they answer (:data:`STANDBY_ADMIT_WAIT_S` at most). Returns the ranks admitted."""
    rollout = groups["rollout"]
    comp = rollout.reservation.spec.component(rollout.component)
    admitted = rollout.admit() if rollout.short else []
    weights = groups["actor"].actors[0].weights.remote()
    for attempt in range(3):
        try:
            rollout.push("load", weights, version, version=version)
            return admitted
        except GONE:  # a rank lost since the last step: found lost, the rest take them
            if not comp.runs_short or attempt == 2:
                raise
            (lost or (lambda: rollout.repair(timeout=300)))()
            if comp.standby:  # its standbys, promoted in a moment: back for the next step
                admitted += rollout.admit(wait_s=STANDBY_ADMIT_WAIT_S)
    return admitted


# How long a push that finds rollout ranks lost waits for their standbys' promotion
# (standby: true beside on_loss: continue; tens of milliseconds once the controller has
# placed the lost slots on the spare), rather than running the next step short.
STANDBY_ADMIT_WAIT_S = 2.0


# A rollout rank's call that fails as one whose worker is gone (its node lost, its
# process killed), or that the group's push gave up on at the controller's verdict (its
# host hung or cut off: clients.RanksLost): with on_loss: continue its prompts go to the
# others. (ActorUnavailableError, a worker not reachable for now, is one: the repair's
# verdict tells a blip from a loss, and a rank that answers again serves again.)
GONE = (ray.exceptions.RayActorError, clients.RanksLost)


def roll_out(
    group,
    step: int,
    version: int,
    prompts: list[int],
    timeout: float,
    lost: Callable[[], None],
    started: Callable[[], None] = lambda: None,
) -> list:
    """Every prompt's group of samples, sorted by prompt: the prompts split over the
    ranks serving weights ``version`` (``WorkerGroup.serving``). When a rank's call
    fails because its worker is gone and the group may run short, ``lost()`` has the
    group find what is lost (its ``repair()``, which returns at once for such a group),
    and that call's prompts go to the ranks still serving, queued behind their own:
    the step goes on, and since each prompt's samples are seeded by the prompt, its
    results are those of a step that lost nothing. Otherwise the error is raised.
    ``started()`` runs once the first calls are out (where a fault mid-rollout strikes).

    Raises:
        StepTimeout: not done within ``timeout``, or no rank serves ``version``.
    """
    deadline = time.monotonic() + timeout
    short = group.reservation.spec.component(group.component).runs_short
    rolled: list = []
    calls: dict = {}

    def send(todo: list[int]) -> None:
        serving = group.serving(version)
        if short and len(serving) < len(group.live):  # one silent: lost, or only slow?
            lost()
            serving = group.serving(version)
        if not serving:
            raise StepTimeout(f"no rollout rank serves weights {version}")
        for actor, part in zip(serving.values(), split(todo, len(serving)), strict=True):
            if part:
                calls[actor.generate.remote(step, part, version)] = part

    send(list(prompts))
    started()
    while calls:
        left = deadline - time.monotonic()
        if left <= 0:
            raise StepTimeout(f"{len(calls)} rollout calls unfinished after {timeout:g}s")
        done, _ = ray.wait(list(calls), num_returns=1, timeout=left)
        for ref in done:
            part = calls.pop(ref)
            try:
                rolled += ray.get(ref)
            except GONE:
                if not short:
                    raise
                lost()
                send(part)
    return sorted(rolled)


def rejoin(groups: dict, last: int) -> dict[str, float]:
    """Every trainer rank re-forms the process group and restores step ``last``; every
    rollout worker takes its weights. Returns how long each part took, in seconds (the
    slowest rank's for the parts inside ``join``)."""
    trainers = groups["actor"].actors
    marks = [time.time()]
    # Every old group down before any rank forms the new one: a rank that joined while
    # rank 0 still finished an old call (a driver killed with the step's updates in
    # flight) met rank 0's old store at the same MASTER_PORT, read the old group's
    # addresses there and failed with "connection refused".
    gather([t.leave.remote() for t in trainers])
    marks.append(time.time())
    gather([trainers[0].host.remote()])  # rank 0's store listens before anyone dials
    marks.append(time.time())
    joined = gather([t.join.remote(last) for t in trainers])
    marks.append(time.time())
    publish(groups, last)
    marks.append(time.time())
    names = ("leave", "host", "join", "publish")
    parts = {k: b - a for k, (a, b) in zip(names, itertools.pairwise(marks), strict=True)}
    for k in joined[0]["took"]:
        parts[f"rank {k}"] = max(j["took"][k] for j in joined)
    return parts
