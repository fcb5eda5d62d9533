"""What each queue holds and waits for, as ``placectl quota`` and the metrics report it.

Pure: computed from the records and quotas alone. A queue's use is what its placed
reservations hold (their slots' bundles); queued reservations hold nothing yet and count
in its depth instead. Reservations made without a queue are reported under ``""``: no
quota applies to them (see the queues guide).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from controller.state.records import QUEUED, ReservationRecord


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
        for slot in res.slots:
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
