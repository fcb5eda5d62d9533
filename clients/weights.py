"""The weights-version guard: no work for a rank that does not hold the job's weights.

A rank that joined since the job's last weight push (a promoted standby, a relaunched
rank, a replacement admitted after running short) holds the weights it loaded at its
start, or none: work sent to it would be generated with stale weights, silently. So:

* **A rank says which version it holds.** The worker's own load method calls
  :func:`hold` once it has the weights; :func:`held` reads it (``None``: none yet).
  Before a push sends the load, each rank is told the load begins (:func:`begin`): it
  holds no version from then until its load says :func:`hold`, so a load that dies
  half-way (an exception, a lost peer of its broadcast) leaves a rank that refuses all
  work, never one that serves the old version with half the new weights.
* **The worker refuses stale work.** A work method calls :func:`require` first, which
  raises :class:`StaleWeights` naming both versions.
* **The group refuses it before sending.** ``WorkerGroup.serving(version)`` gives the
  ranks to send work to (those that answer and hold ``version``); ``WorkerGroup.push``
  sends the job's weights to every rank that answers and checks each says it holds
  them; ``WorkerGroup.execute_async(..., version=v)`` raises :class:`StaleWeights`
  naming the ranks not at ``v``, sending nothing.

The version is the job's own count (a step, a weight-sync counter); placectl only
compares it.
"""

from __future__ import annotations

import contextlib
from typing import Any

from controller import PlacementError

_held: int | None = None  # this process's, set by the worker's own code
_loading: int | None = None  # the version a push is loading here, until hold() says so


class StaleWeights(PlacementError):
    """Work asked of a rank for weights it does not hold."""


def hold(version: int) -> None:
    """In a worker: it now holds the weights of ``version``."""
    global _held, _loading
    _held, _loading = version, None


def _begin_here(_instance: Any, version: int) -> None:
    """Run inside a worker (``__ray_call__``) as a push of ``version`` begins: unless it
    holds that version already, it holds none until its load says :func:`hold` (a torn
    load holds none). Whether it runs before the load or after it (a threaded actor
    runs calls side by side), the rank ends holding ``version`` only if its load did."""
    global _held, _loading
    if _held != version:
        _held, _loading = None, version


def held() -> int | None:
    """In a worker: the version of the weights it holds (None: none yet)."""
    return _held


def require(version: int) -> None:
    """In a worker, before work: raise :class:`StaleWeights` unless it holds ``version``."""
    if _held != version:
        loading = f" (a load of version {_loading} began and did not finish)" if _loading else ""
        raise StaleWeights(
            f"this rank holds the weights of version {_held}{loading}, the work is for "
            f"version {version}: the job pushes its weights to it first"
        )


def _held_here(_instance: Any) -> int | None:
    """Run inside a worker (``__ray_call__``): the version it holds."""
    return _held


# A rank that does not say its version within this long is busy in a call it never ends
# (hung) or unreachable: it is left out, as one whose process died is.
ASK_TIMEOUT_S = 10.0
# How long a push waits for every rank's load by default: a model's weights take
# seconds to minutes to load; a load still running after this is stuck (a peer of its
# broadcast lost, a hung device), and the push says which ranks rather than wait on.
PUSH_TIMEOUT_S = 600.0


class PushTimeout(StaleWeights):
    """A push's loads did not all finish within its bound: the ranks named hold no
    version until a push to them completes."""


def begin(actors: dict[int, Any], version: int) -> list:
    """Tell each rank a load of ``version`` begins (:func:`_begin_here`), sent before the
    load (an actor runs one caller's calls in order; where it runs them side by side the
    order does not matter). Returns the calls' refs, for :func:`settle`: nothing waits
    on them, so a hung rank delays no push."""
    return [a.__ray_call__.remote(_begin_here, version) for a in actors.values()]


def settle(refs: list) -> None:
    """Collect the finished calls of :func:`begin` (a dead rank's error read, not left
    for Ray to report as unhandled); the others are dropped."""
    import ray

    if not refs:
        return
    done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
    for ref in done:
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(ref)


def versions(actors: dict[int, Any], timeout: float = ASK_TIMEOUT_S) -> dict[int, int | None]:
    """Each rank's own word on the version it holds, all asked at once; a rank that
    does not answer within ``timeout`` (dead, hung) is left out."""
    import ray

    refs = {r: a.__ray_call__.remote(_held_here) for r, a in actors.items()}
    if not refs:
        return {}
    done = set(ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)[0])
    out = {}
    for r, ref in refs.items():
        if ref in done:
            try:
                out[r] = ray.get(ref)
            except ray.exceptions.RayError:  # its worker died: not a rank to send work to
                continue
    return out


def refuse_stale(label: str, ranks: list[int], found: dict[int, int | None], version: int) -> None:
    """Raise :class:`StaleWeights` naming the ``ranks`` that did not say ``version`` in
    ``found`` (what :func:`versions` read)."""
    stale = {r: found.get(r, "no answer") for r in ranks if found.get(r, -1) != version}
    if stale:
        said = ", ".join(f"rank {r}: {v}" for r, v in stale.items())
        raise StaleWeights(
            f"{label}: ranks not at weights version {version} ({said}); push the weights "
            "first (WorkerGroup.push), or send work to WorkerGroup.serving(version)"
        )
