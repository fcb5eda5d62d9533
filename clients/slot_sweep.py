"""Ending what a stopped rank left on its node before its slot is used again (what is
left, and how it is found: :func:`controller.surface.end_tagged`).

When a worker is stopped (relaunched by ``repair()``, ``restart()``, a move,
``shutdown()``), placectl runs one task on the worker's node that ends every process
still carrying the tag, before a new worker is started there. Ray's
own workers carrying it (the stopped worker, its child actors) are Ray's to end; the
task waits for them rather than killing them.

A node Ray is draining takes no new task (Ray 2.60: ``TaskUnschedulableError``), and a
drain is when ranks move off a node that lives on until its deadline. So a worker about
to be stopped on a draining node first ends what it started itself, from inside its
own process (:func:`end_from_inside`), while it still runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from controller.surface import Ended, end_tagged

SWEEP_TIMEOUT_S = 15.0


def draining_nodes() -> set[str]:
    """The nodes Ray is draining now (empty when the GCS cannot say)."""
    from controller.surface import draining_nodes as read

    try:
        return set(read(timeout=10))
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
