"""The driver's remote calls: waiting on a step's calls, with a deadline and the first
error at once, and saying an error in one line."""

from __future__ import annotations

import itertools
import time

import ray


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
    while not res.refresh().spares:
        if time.monotonic() > deadline:
            raise RuntimeError("no spare node held within 300 s")
        time.sleep(0.2)
    for group in groups.values():
        group.refill_standbys()
    gather([a.__ray_ready__.remote() for g in groups.values() for a in g.standbys], 600)


def publish(groups: dict, version: int) -> None:
    """Every rollout worker takes trainer rank 0's weights as of step ``version`` and
    confirms it holds them; a worker generates only for the version it holds (a promoted
    standby engine included, whose first weights these are)."""
    weights = groups["actor"].actors[0].weights.remote()
    held = gather([g.load.remote(weights, version) for g in groups["rollout"].actors])
    if held != [version] * len(held):
        raise RuntimeError(f"rollout workers confirmed weights {held}, not {version}")


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
