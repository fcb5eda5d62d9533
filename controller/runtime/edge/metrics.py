"""The controller's metrics: what it reports (:data:`METRICS`), through Ray's metrics
system (:class:`RayMetrics`) or kept in memory (:class:`KeptMetrics`, the fake cluster's).

Exported through Ray's metrics system: in Prometheus each name gains Ray's ``ray_``
prefix and a counter the ``_total`` suffix (:func:`exported`).

Labels are bounded by what an operator configures (queues, resources) or by placectl
(states, causes), never by job names, so a cluster with many jobs does not grow the
series count. Counters and histograms follow from the event history (one event, one
observation); gauges are set at every commit (states) and every tick of the loop
(queues, quotas, whether the table is readable).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported for annotations only: every node's probe imports the edge
    from controller.state.events import Event
    from controller.state.queueing import QueueUsage


class KeptMetrics:
    """Metrics kept in memory (the fake cluster's), so that tests read what a real
    controller exports."""

    def __init__(self) -> None:
        self.states: dict[str, int] = {}
        self.latencies: list[float] = []
        self.events: list[Event] = []
        self.usage: list[QueueUsage] = []
        self.fences: list[str] = []
        self.readable: bool | None = None

    def observe(self, states: dict[str, int]) -> None:
        self.states = dict(states)

    def reserve_latency(self, seconds: float) -> None:
        self.latencies.append(seconds)

    def event(self, event: Event) -> None:
        self.events.append(event)

    def queues(self, usage: list[QueueUsage]) -> None:
        self.usage = list(usage)

    def fence(self, outcome: str) -> None:
        self.fences.append(outcome)

    def table_readable(self, readable: bool) -> None:
        self.readable = readable


NO_QUEUE = "none"  # the queue label of reservations made without a queue

# name -> (kind, labels, help): what the docs list and the scrape test looks for.
METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "placectl_reservations": ("gauge", ("state",), "Reservations by state."),
    "placectl_reserved_accelerators": (
        "gauge",
        ("queue",),
        "Accelerators held by placed reservations, by queue.",
    ),
    "placectl_reserve_latency_seconds": (
        "histogram",
        (),
        "Time to create, place and probe a new reservation.",
    ),
    "placectl_queue_depth": ("gauge", ("queue",), "Reservations waiting for admission."),
    "placectl_queue_oldest_wait_seconds": (
        "gauge",
        ("queue",),
        "How long the oldest reservation waiting in the queue has waited.",
    ),
    "placectl_admission_wait_seconds": (
        "histogram",
        ("queue",),
        "Time from joining a queue to admission.",
    ),
    "placectl_repairs": ("counter", ("cause",), "Degraded reservations made ready again."),
    "placectl_repair_seconds": (
        "histogram",
        ("cause",),
        "Time a reservation spent degraded before its repair.",
    ),
    "placectl_degraded_seconds": (
        "counter",
        ("queue",),
        "Seconds reservations spent degraded (counted when repaired).",
    ),
    "placectl_drain_moves": (
        "counter",
        ("queue",),
        "Reservations moved off draining nodes before their deadline.",
    ),
    "placectl_preemptions": ("counter", ("queue",), "Reservations preempted."),
    "placectl_fences": (
        "counter",
        ("outcome",),
        "Fences of nodes whose raylet stopped answering: fenced, failed (tried again), "
        "denied (placectl's calls refused: Ray's own health checks decide), withheld "
        "(no evidence beyond the controller's own: it reached no majority, or no witness "
        "replied).",
    ),
    "placectl_table_readable": (
        "gauge",
        (),
        "1 while the controller acts on its reservation table, 0 while it refuses every "
        "call because the table cannot be read (a newer placectl's, or corrupt).",
    ),
    "placectl_quota_limit": ("gauge", ("queue", "resource"), "A queue's quota."),
    "placectl_quota_used": (
        "gauge",
        ("queue", "resource"),
        "What a queue's placed reservations hold, per resource with a quota.",
    ),
}

_SECONDS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 7200]


def exported(name: str) -> str:
    """The name Prometheus shows for ``name`` (histograms add _bucket, _sum, _count)."""
    return "ray_" + name + ("_total" if METRICS[name][0] == "counter" else "")


def queue_label(queue: str) -> str:
    return queue or NO_QUEUE


class RayMetrics:
    """:data:`METRICS`, through ``ray.util.metrics``."""

    def __init__(self) -> None:
        from ray.util import metrics

        made = {}
        for name, (kind, labels, text) in METRICS.items():
            if kind == "gauge":
                made[name] = metrics.Gauge(name, text, tag_keys=labels)
            elif kind == "counter":
                made[name] = metrics.Counter(name, text, tag_keys=labels)
            else:
                made[name] = metrics.Histogram(name, text, boundaries=_SECONDS, tag_keys=labels)
        self._m = made
        self._queues: set[str] = set()
        self._quota_series: set[tuple[str, str]] = set()

    def observe(self, states: dict[str, int]) -> None:
        for state, n in states.items():
            self._m["placectl_reservations"].set(n, tags={"state": state})

    def reserve_latency(self, seconds: float) -> None:
        self._m["placectl_reserve_latency_seconds"].observe(seconds)

    def event(self, event: Event) -> None:
        from controller.state import events as ev  # here: see the imports above

        queue = {"queue": queue_label(event.queue)}
        if event.kind == ev.ADMITTED:
            self._m["placectl_admission_wait_seconds"].observe(event.seconds, tags=queue)
        elif event.kind == ev.REPAIRED:
            cause = {"cause": event.cause or ev.OTHER}
            self._m["placectl_repairs"].inc(1, tags=cause)
            self._m["placectl_repair_seconds"].observe(event.seconds, tags=cause)
            if event.seconds > 0:
                self._m["placectl_degraded_seconds"].inc(event.seconds, tags=queue)
        elif event.kind == ev.MOVED:
            self._m["placectl_drain_moves"].inc(1, tags=queue)
        elif event.kind == ev.PREEMPTED:
            self._m["placectl_preemptions"].inc(1, tags=queue)

    def fence(self, outcome: str) -> None:
        self._m["placectl_fences"].inc(1, tags={"outcome": outcome})

    def table_readable(self, readable: bool) -> None:
        self._m["placectl_table_readable"].set(1 if readable else 0)

    def queues(self, usage: list[QueueUsage]) -> None:
        seen, series = set(), set()
        for u in usage:
            queue = queue_label(u.queue)
            seen.add(queue)
            tags = {"queue": queue}
            self._m["placectl_queue_depth"].set(u.queued, tags=tags)
            self._m["placectl_queue_oldest_wait_seconds"].set(u.oldest_wait_s, tags=tags)
            self._m["placectl_reserved_accelerators"].set(u.accelerators, tags=tags)
            for resource, limit in u.limits.items():
                tags = {"queue": queue, "resource": resource}
                series.add((queue, resource))
                self._m["placectl_quota_limit"].set(limit, tags=tags)
                self._m["placectl_quota_used"].set(u.used.get(resource, 0.0), tags=tags)
        for queue in self._queues - seen:  # a queue gone: its gauges read 0, not stale
            for name in ("placectl_queue_depth", "placectl_queue_oldest_wait_seconds"):
                self._m[name].set(0, tags={"queue": queue})
            self._m["placectl_reserved_accelerators"].set(0, tags={"queue": queue})
        for queue, resource in self._quota_series - series:
            tags = {"queue": queue, "resource": resource}
            self._m["placectl_quota_limit"].set(0, tags=tags)
            self._m["placectl_quota_used"].set(0, tags=tags)
        self._queues, self._quota_series = seen, series


__all__ = ["METRICS", "NO_QUEUE", "KeptMetrics", "RayMetrics", "exported", "queue_label"]
