"""Running short: a worker group of a component with ``on_loss: continue`` goes on with
the ranks that answer when some are lost, while their replacements start beside it.

Rollout is embarrassingly parallel: an engine lost of eight should cost an eighth of the
throughput for a while, not a stop. For such a component (never a trainer: the spec
refuses it), ``WorkerGroup.repair()`` returns once the verdict on the lost ranks is in
(Ray's, or the controller's on a node it moved the job off), without relaunching them,
and this module takes over:

* **In the background**, as soon as the reservation is ready with the lost slots placed
  anew (a held spare, a free node, or one the autoscaler adds, on the placement rules of
  any repair), a replacement starts for each, beside the running ranks and named as a
  move's replacements are (``<rank's name>@<epoch>``), so a restarted driver finds it.
  A replacement whose start fails, or whose slot moves again, is started anew. Where
  the component keeps standbys (``standby: true``) and the slot took a held spare of
  its kind, the standby in the rank's new bundle is the replacement: promoted, not
  started, and ready as soon as it answers.
* **Nothing sends a replacement work** until the job admits it
  (``WorkerGroup.admit()``), which a job does at its next weight push: the replacement
  is then a rank and takes the weights with the others (:mod:`clients.weights` refuses
  work for a rank that does not hold the job's version).
* **What is short is on record** in the GCS (``short/<job>/<component>``, namespace
  ``placectl-workers``): the ranks lost and not admitted back, since when, and which
  replacements are ready. ``placectl status`` reads it, so a job that never admits its
  replacements is seen running short.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import ray

from clients.launching import WORKER_NAMESPACE
from clients.ray_state import gcs
from clients.reservation import Reservation
from controller import PlacementError, ReservationTimeout

_KV_PREFIX = b"short/"
# How long the background start waits for the reservation at a time, and how often it
# says what it waits for (a free node may take minutes to come).
WAIT_STEP_S, SAY_EVERY_S = 5.0, 30.0


class ShortRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What a group running short has on record in the GCS."""

    ranks: list[int]  # lost and not admitted back
    since: float  # wall-clock time the earliest of them was lost
    ready: list[int] = []  # replacements started, waiting for the job to admit them


_RECORD = msgspec.json.Decoder(ShortRecord)


def _key(job: str, component: str) -> bytes:
    return _KV_PREFIX + f"{job}/{component}".encode()


def short_record(job: str, component: str) -> ShortRecord | None:
    """The group of ``job``/``component`` running short, or None (one GCS read)."""
    got = gcs().internal_kv_get(_key(job, component), WORKER_NAMESPACE.encode())
    return None if got is None else _RECORD.decode(got)


def short_states(reservation: Any) -> dict[str, ShortRecord]:
    """For each component of ``reservation`` with ``on_loss: continue`` whose group runs
    short now, its record (what ``placectl status`` shows)."""
    out = {}
    for name in reservation.components:
        if reservation.spec.component(name).runs_short:
            record = short_record(reservation.job, name)
            if record is not None:
                out[name] = record
    return out


class Replacements:
    """The lost ranks of one group and the replacements starting for them (see the
    module docstring). Every change to the group's roster, here or by the group, is made
    holding :attr:`lock`: the background start and the driver's calls interleave.

    Args:
        reservation: the group's reservation (the background start reads a copy of it).
        component: the group's component.
        roster: the group's :class:`clients.roster.Roster`.
        say: where to say what happens (default stderr).
    """

    def __init__(
        self, reservation: Any, component: str, roster: Any, say: Callable[[str], None] | None
    ) -> None:
        self.reservation, self.component, self.roster = reservation, component, roster
        self.say = say or (lambda m: print(f"placectl: {m}", file=sys.stderr, flush=True))
        self.label = f"{reservation.job}/{component}"
        self.lock = threading.RLock()
        self.lost: dict[int, float] = {}  # rank -> when it was found lost (wall clock)
        self.away: set[str] = set()  # nodes its lost ranks' slots moved off, left alone
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def ranks(self) -> list[int]:
        return sorted(self.lost)

    def lose(self, ranks: list[int], away: set[str]) -> None:
        """``ranks`` are lost: no work goes to them from now on, and their replacements
        start as soon as the reservation has placed them anew."""
        with self.lock:
            now = time.time()
            for r in ranks:
                self.lost.setdefault(r, now)
            self.away |= away
            self._record()
            self._start_thread()

    def _start_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._replace, name=f"placectl-short-{self.label}", daemon=True
        )
        self._thread.start()

    def _replace(self) -> None:
        """The background start: until every lost rank has a replacement (started, or
        ready), wait for the reservation to place them and start the replacements. It
        never dies of an error: it says it, waits a moment and tries again."""
        own = Reservation(self.reservation.controller, self.reservation.info)
        said = 0.0
        while not self._stop.is_set():
            with self.lock:
                waiting = [r for r in self.lost if r not in self.roster.prepared]
                if not waiting:  # decided under the lock: a lose() after starts a new one
                    self._thread = None
                    return
            try:
                placed = self._start_placed(own, waiting)
                why = "" if placed else "their slots are not placed anew yet"
            except ReservationTimeout as e:
                placed, why = [], str(e).splitlines()[0][:160]
            except Exception as e:  # a GCS hiccup, a start refused: said, tried again
                placed, why = [], f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            if placed:
                with self.lock:
                    since = time.time() - min((self.lost[r] for r in placed if r in self.lost),
                                              default=time.time())  # fmt: skip
                self.say(
                    f"{self.label}: replacements of ranks {placed} starting at epoch "
                    f"{own.epoch}, {since:.1f}s after the loss; the job admits them once "
                    "started (admit())"
                )
                continue
            if time.monotonic() - said >= SAY_EVERY_S:
                said = time.monotonic()
                self.say(f"{self.label}: running short of ranks {waiting}: waiting ({why})")
            self._stop.wait(0.25)

    def _start_placed(self, own: Any, waiting: list[int]) -> list[int]:
        """Once the reservation is ready (within :data:`WAIT_STEP_S`), start the
        replacements of the ``waiting`` ranks whose slots are on live nodes; those."""
        own.wait_ready(WAIT_STEP_S, progress=lambda _m: None)
        fresh = own.assignments(self.component)
        dead = own.controller.dead_nodes({fresh[r].placement.node_id for r in waiting})
        placed = [r for r in waiting if fresh[r].placement.node_id not in dead]
        if not placed:
            return []
        with self.lock:
            if self._stop.is_set():
                return []
            keep = [r for r in self.roster.prepared if r in self.lost]
            self.roster.prepare(sorted({*keep, *placed}), fresh)
            self._record()
        return placed

    def ready(self, record: bool = True) -> list[int]:
        """The lost ranks whose replacement has started and answers. A replacement whose
        start failed (its constructor raised, its node died) is dropped and started anew."""
        with self.lock:
            refs = {r: self.roster.ready_ref(r) for r in self.lost if r in self.roster.prepared}
            if not refs:
                return []
            done = set(ray.wait(list(refs.values()), num_returns=len(refs), timeout=0)[0])
            out, failed = [], []
            for r, ref in refs.items():
                if ref not in done:
                    continue
                try:
                    ray.get(ref, timeout=0)
                    out.append(r)
                except Exception as e:  # it never started: another try
                    failed.append(r)
                    self.say(f"{self.label}: the replacement of rank {r} failed to start: {e}")
            if failed:
                self.roster.drop_prepared(keep=set(self.roster.prepared) - set(failed))
                self._start_thread()
            if record:  # admit() records once, after it admits
                self._record(ready=out)
            return sorted(out)

    def wait_ready(self, ranks: list[int], within: float) -> list[int]:
        """The lost ranks of ``ranks`` whose replacement is ready, waiting at most
        ``within`` seconds for every one of them (started or promoted meanwhile by the
        background start); never longer, whatever is ready by then."""
        deadline = time.monotonic() + within
        while True:
            ready = [r for r in self.ready(record=False) if r in ranks]
            if set(ready) >= set(ranks) & set(self.lost) or time.monotonic() >= deadline:
                return ready
            time.sleep(0.02)

    def admit(self, ranks: list[int]) -> list[int]:
        """Make the ready replacements of ``ranks`` the ranks; returns those admitted."""
        with self.lock:
            ready = set(self.ready(record=False))
            unknown = [r for r in ranks if r not in self.lost]
            if unknown:
                raise PlacementError(
                    f"{self.label}: ranks {unknown} are not lost; lost now: {self.ranks or 'none'}"
                )
            admitted = sorted(r for r in ranks if r in ready)
            if admitted:
                self.roster.swap_in(admitted, away=self.away)
                for r in admitted:
                    del self.lost[r]
                if not self.lost:
                    self.away = set()
            self._record(ready=sorted(ready - set(admitted)))
            return admitted

    def settled(self, ranks: list[int]) -> None:
        """``ranks`` were started by other means (``sync()``, ``restart()``): not lost."""
        with self.lock:
            if any(self.lost.pop(r, None) is not None for r in ranks):
                self._record()

    def stop(self) -> None:
        """No more background starts (the group shuts down); the record goes."""
        self._stop.set()
        with self.lock:
            self.lost.clear()
            self._record()

    def _record(self, ready: list[int] | None = None) -> None:
        key, ns = _key(self.reservation.job, self.component), WORKER_NAMESPACE.encode()
        with contextlib.suppress(Exception):  # a record is for status: never fails a step
            if not self.lost:
                gcs().internal_kv_del(key, False, ns)
                return
            if ready is None:
                prepared = [r for r in self.lost if r in self.roster.prepared]
                done = ray.wait(
                    [self.roster.ready_ref(r) for r in prepared],
                    num_returns=len(prepared),
                    timeout=0,
                )[0] if prepared else []  # fmt: skip
                ready = [r for r in prepared if self.roster.ready_ref(r) in set(done)]
            record = ShortRecord(
                ranks=self.ranks, since=min(self.lost.values()), ready=sorted(ready)
            )
            gcs().internal_kv_put(key, msgspec.json.encode(record), True, ns)
