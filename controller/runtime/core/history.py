"""The history: what happened to reservations, bounded, kept with the table.

:class:`History` is fed by the state owner at every commit (the record before and after,
read by :func:`controller.state.events.happened`) and by quota changes, so there is no
other way for an event to appear. Each event is signed with who acted (:func:`acting_as`,
set by the controller's calls for their duration and inherited by the tasks they start;
the control loop acts as ``controller``), numbered and handed to the metrics. The state
owner writes them to the GCS beside the table (``event/<seq>``) a moment after the change:
the history is not part of the write-ahead contract (a controller killed between a change
and that write loses the change's event, never the change). The newest ``limit`` events
are kept; older keys are deleted as new ones are written.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import logging
from collections.abc import Iterator

import msgspec

from controller.runtime import core
from controller.runtime.edge import Metrics
from controller.state import events as ev
from controller.state.records import ReservationRecord

log = logging.getLogger("placectl.controller")

DEFAULT_LIMIT = 1000

_acting: contextvars.ContextVar[str] = contextvars.ContextVar("placectl_acting", default="")


@contextlib.contextmanager
def acting_as(by: str) -> Iterator[None]:
    """Sign the events of what runs inside (tasks started inside included) with ``by``."""
    token = _acting.set(by)
    try:
        yield
    finally:
        _acting.reset(token)


def client(owner: str, forced: bool = False) -> str:
    """How an event names a client: by the first characters of its owner hash."""
    who = f"client {owner[:8]}" if owner else "client (no token)"
    return who + (" (forced)" if forced else "")


class History:
    """The newest events, in memory (see the module docstring); the state owner writes
    them to the table (:meth:`unwritten`, :meth:`written`).

    Args:
        metrics: told every event (counters and histograms follow from events).
        limit: how many events are kept.
    """

    def __init__(self, metrics: Metrics, limit: int = DEFAULT_LIMIT) -> None:
        self._metrics = metrics
        self.limit = limit
        self._events: collections.deque[ev.Event] = collections.deque(maxlen=limit)
        self._seq = 0
        self._unwritten: list[ev.Event] = []
        self._degraded_since: dict[str, float] = {}

    # ------------------------------------------------------------ writes
    def changed(self, old: ReservationRecord | None, new: ReservationRecord | None) -> None:
        """One commit of a job's record happened: record its events."""
        rec = new if new is not None else old
        if rec is None:
            return
        # The records' own times (queued_at, a drain's deadline) read core.wall(): so do
        # their events, or a wait they measure comes out negative (then 0) wherever the
        # loop's clock and the machine's part (the unit tests' virtual-time loop).
        since = self._degraded_since.get(rec.job, 0.0)
        for event in ev.happened(old, new, since, now=core.wall()):
            self.add(event)

    def add(self, event: ev.Event) -> ev.Event:
        """Number, sign, keep and report ``event``; returns it as kept."""
        self._seq += 1
        event = msgspec.structs.replace(
            event, seq=self._seq, by=_acting.get() or event.by or ev.CONTROLLER
        )
        self._events.append(event)
        self._unwritten.append(event)
        self._track(event)
        try:
            self._metrics.event(event)
        except Exception:  # metrics never stop a change
            log.exception("reporting event %d failed", event.seq)
        return event

    def unwritten(self) -> list[ev.Event]:
        """The events not written to the table yet, handed over (give them back with
        :meth:`unwrite` if the write fails)."""
        batch, self._unwritten = self._unwritten, []
        return batch

    def unwrite(self, batch: list[ev.Event]) -> None:
        """A write of ``batch`` failed: it is written with the next one."""
        self._unwritten[:0] = batch

    # ------------------------------------------------------------ reads
    def since(self, after: int = 0, job: str | None = None, limit: int = 100) -> list[ev.Event]:
        """The newest ``limit`` events numbered above ``after`` (of ``job``, or of every
        job and queue), oldest first."""
        found = [e for e in self._events if e.seq > after and (job is None or e.job == job)]
        return found[-limit:] if limit > 0 else []

    @property
    def last_seq(self) -> int:
        return self._seq

    def restore(self, loaded: list[ev.Event], highest: int) -> None:
        """Take the history read back from the table (recovery); numbering goes on from
        ``highest`` (the highest number stored, readable or not)."""
        self._seq = max(self._seq, highest, *(e.seq for e in loaded))
        kept = {e.seq for e in self._events}
        merged = sorted([*self._events, *(e for e in loaded if e.seq not in kept)], key=_seq)
        self._events = collections.deque(merged[-self.limit :], maxlen=self.limit)
        self._degraded_since = {}
        for e in self._events:
            self._track(e)

    def _track(self, event: ev.Event) -> None:
        if event.kind == ev.DEGRADED_EV:
            self._degraded_since[event.job] = event.at
        elif event.kind in (ev.REPAIRED, ev.RELEASED, ev.RELEASING_EV):
            self._degraded_since.pop(event.job, None)


def _seq(event: ev.Event) -> int:
    return event.seq


__all__ = ["History", "acting_as", "client"]
