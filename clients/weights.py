"""The weights-version guard: no work for a rank that does not hold the job's weights.

A rank that joined since the job's last weight push (a promoted standby, a relaunched
rank, a replacement admitted after running short) holds the weights it loaded at its
start, or none: work sent to it would be generated with stale weights, silently. So:

* **A rank says which version it holds.** The worker's own load method calls
  :func:`hold` once it has the weights; :func:`held` reads it (``None``: none yet).
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

from typing import Any

from controller import PlacementError

_held: int | None = None  # this process's, set by the worker's own code


class StaleWeights(PlacementError):
    """Work asked of a rank for weights it does not hold."""


def hold(version: int) -> None:
    """In a worker: it now holds the weights of ``version``."""
    global _held
    _held = version


def held() -> int | None:
    """In a worker: the version of the weights it holds (None: none yet)."""
    return _held


def require(version: int) -> None:
    """In a worker, before work: raise :class:`StaleWeights` unless it holds ``version``."""
    if _held != version:
        raise StaleWeights(
            f"this rank holds the weights of version {_held}, the work is for version "
            f"{version}: the job pushes its weights to it first"
        )


def _held_here(_instance: Any) -> int | None:
    """Run inside a worker (``__ray_call__``): the version it holds."""
    return _held


# A rank that does not say its version within this long is busy in a call it never ends
# (hung) or unreachable: it is left out, as one whose process died is.
ASK_TIMEOUT_S = 10.0


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
