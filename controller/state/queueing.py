"""Which queued reservations may be placed now: pure, decided on the controller's view of
free resources.

**Order.** Every queued reservation, whatever its queue, in one order: higher priority
first, then first come first served (``queued_at``), then the job name. Queues group
reservations for quotas and for ``placectl queue``.

**Gang admission.** A reservation is admitted only when every slot it plans fits what its
node has free (less what this decision already admitted): its groups are created only
then, so no part of it holds resources while it waits.

**No starvation.** A reservation that does not fit holds the nodes it would use: nothing
after it in the order is admitted onto any of them, even when it would fit. Smaller
reservations backfill only nodes that no earlier waiting reservation needs. So a waiting
reservation waits for the reservations already placed on its nodes to release, and for
those before it in the order, never for later ones.

**Preemption (opt-in).** A reservation made ``preemptible`` may be taken back for a
waiting one of higher priority: when the waiting one would fit on its nodes if some
preemptible reservations of lower priority there were gone, those are chosen (lowest
priority first, only as many as needed; none at all if that is not enough, so nothing is
taken in vain), given a deadline, and released at it. Nothing that is not preemptible is
ever taken.

**Quotas.** A queue may have a quota: at most so many units of each resource (``GPU``,
``franka``, ...) held by its admitted reservations together. A reservation that would
exceed it waits, holding nothing (its queue is full, not the cluster).

**Usage.** What each queue holds and waits for (``placectl quota``, the metrics): a
queue's use is what its placed reservations hold (their slots' bundles); queued ones hold
nothing yet and count in its depth instead. Reservations made without a queue are
reported under ``""``: no quota applies to them (see the queues guide).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import msgspec

from controller.state.records import QUEUED, ReservationRecord

EPSILON = 1e-9


class Terms(msgspec.Struct, frozen=True, kw_only=True):
    """What a ``reserve`` asks beyond its spec: where it waits, at what priority, who
    owns it (a token hash), and whether it may be taken back."""

    queue: str = ""
    priority: int = 0
    owner: str = ""
    preemptible: bool = False
    preempt_grace: float = 0.0

    @classmethod
    def of(cls, record) -> Terms:
        return cls(
            queue=record.queue,
            priority=record.priority,
            owner=record.owner,
            preemptible=record.preemptible,
            preempt_grace=record.preempt_grace,
        )


class Entry(msgspec.Struct, frozen=True, kw_only=True):
    """One queued reservation as the decision sees it.

    Attributes:
        job, queue, priority, queued_at: from its record.
        needs: what it would hold on each node (node id -> resource -> amount), or None
            when it cannot be planned now (``why`` says why).
        why: why it cannot be planned (nodes missing, ...).
    """

    job: str
    queue: str
    priority: int = 0
    queued_at: float = 0.0
    needs: dict[str, dict[str, float]] | None = None
    why: str = ""

    def total(self) -> dict[str, float]:
        return add_up((self.needs or {}).values())


class Holding(msgspec.Struct, frozen=True, kw_only=True):
    """A placed reservation as preemption sees it.

    Attributes:
        job, priority, preemptible: from its record.
        needs: what it holds per node.
        leaving: it is being preempted already (its resources are as good as free).
    """

    job: str
    priority: int = 0
    preemptible: bool = False
    needs: dict[str, dict[str, float]] = {}
    leaving: bool = False


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """What one pass decided.

    Attributes:
        admitted: jobs to place now, in order.
        waiting: for each job left queued, its position (1 = next) and why it waits.
        preempt: placed reservations to take back, each for the waiting job named.
    """

    admitted: list[str] = []
    waiting: dict[str, tuple[int, str]] = {}
    preempt: dict[str, str] = {}


def victims(
    e: Entry, left: Mapping[str, Mapping[str, float]], holdings: Iterable[Holding]
) -> list[str] | None:
    """The preemptible reservations of lower priority whose leaving would let ``e`` fit:
    lowest priority first, only as many as needed; [] when those already leaving free
    enough; None when it cannot fit even so (then nothing is taken)."""
    on: dict[str, list[Holding]] = {}
    for h in holdings:
        for node_id in h.needs:
            on.setdefault(node_id, []).append(h)
    taken: set[str] = set()
    for node_id, need in (e.needs or {}).items():
        here = on.get(node_id, [])
        have = dict(left.get(node_id, {}))
        for h in here:
            if h.leaving or h.job in taken:
                for k, v in h.needs[node_id].items():
                    have[k] = have.get(k, 0.0) + v
        pool = sorted(
            (
                h
                for h in here
                if h.preemptible
                and h.priority < e.priority
                and not h.leaving
                and h.job not in taken
            ),
            key=lambda h: (h.priority, h.job),
        )
        while any(v > have.get(k, 0.0) + EPSILON for k, v in need.items()):
            if not pool:
                return None
            h = pool.pop(0)
            taken.add(h.job)
            for k, v in h.needs[node_id].items():
                have[k] = have.get(k, 0.0) + v
    return sorted(taken)


def quota_excess(
    limit: Mapping[str, float], used: Mapping[str, float], wants: Mapping[str, float]
) -> dict[str, float]:
    """What ``used`` plus ``wants`` would come to, for each resource it takes past
    ``limit`` ({} when within it)."""
    return {
        k: used.get(k, 0.0) + v
        for k, v in wants.items()
        if k in limit and used.get(k, 0.0) + v > limit[k] + EPSILON
    }


def order(entries: Iterable[Entry]) -> list[Entry]:
    """The admission order: priority (higher first), then arrival, then name."""
    return sorted(entries, key=lambda e: (-e.priority, e.queued_at, e.job))


def add_up(amounts: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Resource amounts summed (``{"GPU": 1} + {"GPU": 1, "CPU": 2}``)."""
    out: dict[str, float] = {}
    for amount in amounts:
        for k, v in amount.items():
            out[k] = out.get(k, 0.0) + v
    return out


def needs_by_node(slots: Iterable[tuple[str, Mapping[str, float]]]) -> dict[str, dict[str, float]]:
    """Sum ``(node_id, need)`` pairs into what a reservation holds per node."""
    out: dict[str, dict[str, float]] = {}
    for node_id, need in slots:
        mine = out.setdefault(node_id, {})
        for k, v in need.items():
            mine[k] = mine.get(k, 0.0) + v
    return out


def _fmt(amounts: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(amounts.items()))


def decide(
    entries: Iterable[Entry],
    free: Mapping[str, Mapping[str, float]],
    *,
    quotas: Mapping[str, Mapping[str, float]] | None = None,
    used: Mapping[str, Mapping[str, float]] | None = None,
    name: Callable[[str], str] = lambda node_id: node_id[:12],
    holders: Callable[[str], Iterable[str]] = lambda node_id: (),
    holdings: Iterable[Holding] = (),
) -> Decision:
    """Admit what fits, in order, without letting anything pass a waiting reservation
    on the nodes it needs (see the module docstring).

    Args:
        entries: the queued reservations.
        free: what each alive node has free now (node id -> resource -> amount).
        quotas: each queue's limit per resource (absent: no limit).
        used: what each queue's admitted reservations hold (resource -> amount).
        name: how a node is named in a reason (rank and IP).
        holders: the jobs holding resources on a node, for "held by" in a reason.
        holdings: the placed reservations, for preemption.
    """
    holdings = list(holdings)
    preempt: dict[str, str] = {}
    left = {n: dict(v) for n, v in free.items()}
    queue_used = {q: dict(v) for q, v in (used or {}).items()}
    held_for: dict[str, str] = {}  # node id -> the first waiting job that needs it
    admitted: list[str] = []
    waiting: dict[str, tuple[int, str]] = {}
    for e in order(entries):
        position = len(waiting) + 1
        if e.needs is None:
            waiting[e.job] = (position, e.why or "cannot be planned yet")
            continue
        limit = (quotas or {}).get(e.queue)
        if limit:
            over = quota_excess(limit, queue_used.get(e.queue, {}), e.total())
            if over:
                quota = _fmt({k: limit[k] for k in over})
                waiting[e.job] = (
                    position,
                    f"queue {e.queue!r} is at its quota ({quota}); admitting it would "
                    f"make {_fmt(over)}",
                )
                continue
        ahead = sorted({held_for[n] for n in e.needs if n in held_for})
        if ahead:
            for node_id in e.needs:  # it holds the rest of its nodes too, meanwhile
                held_for.setdefault(node_id, e.job)
            waiting[e.job] = (position, f"waits behind {', '.join(ahead)} for its nodes")
            continue
        short = []
        for node_id, need in sorted(e.needs.items()):
            have = left.get(node_id)
            if have is None:
                short.append(f"{name(node_id)} is not alive")
                continue
            lacking = {k: v for k, v in need.items() if v > have.get(k, 0.0) + EPSILON}
            if lacking:
                owners = sorted(set(holders(node_id)))
                by = f" (held by {', '.join(owners[:4])})" if owners else ""
                free_now = _fmt({k: have.get(k, 0.0) for k in lacking})
                short.append(f"{name(node_id)} needs {_fmt(lacking)}, has {free_now} free{by}")
        if short:
            for node_id in e.needs:
                held_for.setdefault(node_id, e.job)
            more = f"; and {len(short) - 2} more node(s)" if len(short) > 2 else ""
            why = "; ".join(short[:2]) + more
            chosen = victims(e, left, holdings) if holdings else None
            if chosen is not None:
                holdings = [
                    msgspec.structs.replace(h, leaving=True) if h.job in chosen else h
                    for h in holdings
                ]
                preempt.update(dict.fromkeys(chosen, e.job))
                leaving = sorted(
                    h.job for h in holdings if h.leaving and set(h.needs) & set(e.needs)
                )
                why = f"waits for preempted {', '.join(leaving)} to leave"
            waiting[e.job] = (position, why)
            continue
        for node_id, need in e.needs.items():
            for k, v in need.items():
                left[node_id][k] = left[node_id].get(k, 0.0) - v
        mine = queue_used.setdefault(e.queue, {})
        for k, v in e.total().items():
            mine[k] = mine.get(k, 0.0) + v
        admitted.append(e.job)
    return Decision(admitted=admitted, waiting=waiting, preempt=preempt)


__all__ = [
    "Decision",
    "Entry",
    "Holding",
    "Terms",
    "add_up",
    "decide",
    "needs_by_node",
    "order",
    "quota_excess",
    "victims",
]


class QueueUsage(msgspec.Struct, frozen=True, kw_only=True):
    """One queue's quota beside its use.

    Attributes:
        queue: its name (``""``: reservations made without a queue).
        limits: its quota, resource -> most its placed reservations may hold ({}: none).
        used: what its placed reservations hold now, resource -> amount.
        placed: how many of its reservations are placed (any state but queued).
        accelerators: the accelerators they hold.
        queued: how many wait for admission.
        oldest_wait_s: how long the oldest of those has waited (0: none waits).
    """

    queue: str
    limits: dict[str, float] = {}
    used: dict[str, float] = {}
    placed: int = 0
    accelerators: int = 0
    queued: int = 0
    oldest_wait_s: float = 0.0


def usage(
    records: Iterable[ReservationRecord],
    quotas: Mapping[str, Mapping[str, float]],
    now: float,
) -> list[QueueUsage]:
    """Every queue that has a quota or a reservation, by name."""
    used: dict[str, dict[str, float]] = {}
    counts: dict[str, list[int]] = {}  # queue -> [placed, accelerators, queued]
    oldest: dict[str, float] = {}
    for res in records:
        count = counts.setdefault(res.queue, [0, 0, 0])
        held = used.setdefault(res.queue, {})
        if res.state == QUEUED:
            count[2] += 1
            if res.queued_at:
                oldest[res.queue] = max(oldest.get(res.queue, 0.0), now - res.queued_at)
            continue
        count[0] += 1
        count[1] += res.accelerators()
        for slot in (*res.slots, *res.spares):  # held spares count against the quota
            for k, v in slot.need().items():
                held[k] = held.get(k, 0.0) + v
    out = []
    for queue in sorted(set(counts) | set(quotas)):
        placed, accelerators, queued = counts.get(queue, (0, 0, 0))
        out.append(
            QueueUsage(
                queue=queue,
                limits=dict(quotas.get(queue, {})),
                used=used.get(queue, {}),
                placed=placed,
                accelerators=accelerators,
                queued=queued,
                oldest_wait_s=max(0.0, oldest.get(queue, 0.0)),
            )
        )
    return out


__all__ = ["QueueUsage", "usage"]
