"""Text tables of queues, quotas and the event history, as ``placectl queue``, ``quota``
and ``events`` print them."""

from __future__ import annotations

import time

from controller.state.events import Event
from controller.state.queueing import QueueUsage


def _table(rows: list[list[str]], last_free: bool = True) -> str:
    """Columns padded to their widest cell; the last column is not padded."""
    n = len(rows[0])
    widths = [max(len(r[i]) for r in rows) for i in range(n)]
    if last_free:
        widths[-1] = 0
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def render_queue(entries, now: float) -> str:
    """``placectl queue``: one line per queued reservation, next first."""
    if not entries:
        return "the queue is empty"
    rows = [("#", "job", "queue", "prio", "waiting", "wants", "why")]
    for e in entries:
        wants = ", ".join(f"{k} {v:g}" for k, v in sorted(e.wants.items()) if k != "CPU") or "-"
        rows.append(
            (
                str(e.position),
                e.job,
                e.queue,
                str(e.priority),
                _age(now - e.queued_at),
                wants,
                e.why,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r[:6], widths, strict=True)) + "  " + r[6]
        for r in rows
    )


def _amounts(amounts: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in sorted(amounts.items())) or "-"


def render_quotas(usage: list[QueueUsage]) -> str:
    """``placectl quota``: each queue's quota beside what it holds and how many wait."""
    if not usage:
        return "no queues and no quotas"
    rows = [["QUEUE", "QUOTA", "USED", "PLACED", "QUEUED", "OLDEST WAIT"]]
    for u in usage:
        used = {k: u.used.get(k, 0.0) for k in u.limits} if u.limits else {}
        if not u.limits and u.accelerators:
            used = {k: v for k, v in u.used.items() if k != "CPU" and not k.startswith("node:")}
        rows.append(
            [
                u.queue or "(none)",
                _amounts(u.limits) if u.limits else "no quota",
                _amounts(used),
                str(u.placed),
                str(u.queued),
                _age(u.oldest_wait_s) if u.queued else "-",
            ]
        )
    return _table(rows)


def render_events(events: list[Event], header: bool = True) -> str:
    """``placectl events``: one line per event, oldest first."""
    if not events:
        return "no events"
    rows = [["#", "TIME", "JOB", "EVENT", "BY", "WHAT"]] if header else []
    for e in events:
        when = time.strftime("%m-%d %H:%M:%S", time.localtime(e.at))
        job = e.job or (f"queue {e.queue}" if e.queue else "-")
        what = e.message + (f" [cause {e.cause}]" if e.cause else "")
        rows.append([str(e.seq), when, job, e.kind, e.by, what])
    return _table(rows)
