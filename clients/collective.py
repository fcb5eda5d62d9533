"""Inside a rank: a collective group whose calls end when a member is lost.

A peer whose host is cut off or hung keeps its connections open: gloo's survivors wait
out its timeout (30 minutes by default), NCCL's its watchdog, while Ray still calls the
peer alive. A :class:`GuardedGroup` is formed over a component's ranks from their
assignments, at a *generation* (the reservation's epoch it was formed at), and watches
its members while a collective of it is pending: once the controller's verdict on a
member's node is in (suspected, its slot moved, dead or fenced), or the member's slot
has moved in the reservation (a standby promoted, a relaunch elsewhere), the pending
call ends with :class:`PeerLost` naming the lost ranks and why, and every later call on
that generation refuses with it. A collective that is merely slow is never ended: only
a verdict or a move ends one, never a time.

The survivors keep their processes and memory: :meth:`GuardedGroup.reform` forms the
next generation with the reservation's current assignments, where the replacements
(promoted standbys, or ranks ``repair()`` relaunched) form it too (``GuardedGroup.form``).

gloo only. What ends a pending gloo collective from outside: nothing torch offers (its
``abort`` and ``shutdown`` leave a pending all-reduce blocked); so each call is started
asynchronously and waited for in short slices, and the work is abandoned, not joined,
when its generation ends (its thread ends at gloo's own timeout).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from clients.members import LOOK_WAIT_S, ControllerLook
from controller.errors import PlacementError

# How long a collective may be pending before its members are watched: most finish in
# milliseconds, and a call that does not is the one whose peers are asked about.
WATCH_AFTER_S = 0.2
SLICE_S = 0.005  # how often a pending call checks whether it completed or was ended
# gloo's own timeout for a call: a slow peer is never given up for time alone; the
# generation's end is the controller's word.
BACKEND_TIMEOUT = datetime.timedelta(minutes=30)
# Where a rank that ended a generation says so, in the generation's own rendezvous
# store, and how often a waiting rank reads it: a peer that saw its neighbour die (its
# socket closed) ends the ranks that wait on that peer, not on the dead one.
ENDED_KEY = "placectl/ended"
ACTOR_KEY = "placectl/actor"  # each member's Ray actor id
HEARD_EVERY_S = 0.1


class PeerLost(PlacementError):
    """A member of the group's generation is lost: the pending collective ended and
    every later call on this generation refuses. Form the next with ``reform()``.

    Attributes:
        ranks: each lost rank, and why.
        generation: the generation that ended (``epoch.round``).
    """

    def __init__(
        self, message: str, ranks: Mapping[int, str] | None = None, generation: str = ""
    ) -> None:
        super().__init__(message)
        self.ranks = dict(ranks or {})
        self.generation = generation

    def __reduce__(self):  # crosses Ray with its fields
        return (type(self), (str(self), self.ranks, self.generation))


class GuardedGroup:
    """One generation of a component's gloo group, held by one rank.

    Form it with :meth:`form` inside a placed rank (every rank of the component calls
    it); call :meth:`all_reduce`, :meth:`broadcast` and :meth:`barrier` on it. After
    :class:`PeerLost`, every rank (survivors and replacements) forms the next generation:
    survivors with :meth:`reform`, replacements with :meth:`form`.
    """

    def __init__(
        self,
        pg: Any,
        rank: int,
        members: Sequence[str],
        generation: str,
        look: Callable[[Sequence[str], int], Mapping[int, str]],
        name: str,
        store: Any = None,
    ) -> None:
        self.pg, self.rank, self.members = pg, rank, list(members)
        self.world_size, self.generation, self.name = len(self.members), generation, name
        self._look = look
        self._store = store  # the generation's rendezvous store: where an end is said
        self._lost: dict[int, str] = {}
        self._ended: PeerLost | None = None
        self._pending = threading.Event()  # a call waits: the watcher looks meanwhile
        self._watcher: threading.Thread | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------ forming
    @classmethod
    def form(cls, timeout: float = 300.0) -> GuardedGroup:
        """Form this rank's group (every rank of the component calls it) with the
        reservation's current assignments, once it is ready: rank 0 serves the
        rendezvous on its ``MASTER_ADDR``/``MASTER_PORT``. Returns once every rank has
        joined.

        Raises:
            PlacementError: not a placed rank; the component runs short (``on_loss:
                continue``: its membership changes rank by rank); the reservation not
                ready within ``timeout``.
        """
        from clients.inside import placed
        from clients.reservation import Reservation
        from clients.session import Controller

        job, component, rank, name = placed()
        ctl = Controller(None, name)
        deadline = time.monotonic() + timeout
        record = ctl.record(job)
        if component in record.world_sizes and record.spec.component(component).runs_short:
            raise PlacementError(
                f"{job}/{component} runs short (on_loss: continue): its ranks leave and "
                "rejoin one by one, which a group of fixed membership cannot follow; "
                "form one over a component that is repaired whole"
            )
        while record.state != "ready":
            if time.monotonic() > deadline:
                raise PlacementError(
                    f"{job}/{component}: the reservation was not ready within {timeout:g}s "
                    f"to form a group ({record.state}: {record.reason or 'no reason given'})"
                )
            time.sleep(0.2)
            record = ctl.record(job)
        mine = Reservation(ctl, record).assignments(component, allow_degraded=True)
        return cls.form_at(
            mine[0].env["MASTER_ADDR"],
            int(mine[0].env["MASTER_PORT"]),
            rank,
            [a.placement.node_id for a in mine],
            record.epoch,
            ControllerLook(ctl, job, component, record.uid),
            f"placectl/{job}/{component}/{record.uid}",
            max(deadline - time.monotonic(), 1.0),
        )

    @classmethod
    def form_at(
        cls,
        addr: str,
        port: int,
        rank: int,
        members: Sequence[str],
        epoch: int,
        look: Callable[[Sequence[str], int], Mapping[int, str]],
        name: str,
        timeout: float = 300.0,
    ) -> GuardedGroup:
        """Form a generation from its parts (:meth:`form` reads them from the
        reservation): the rendezvous at ``addr:port``, which rank 0 serves (and keeps
        serving to later generations); ``members`` each rank's node id.

        A generation is the epoch and a round: every rank that forms counts itself in
        at the rendezvous, so the survivors and the replacement of a rank relaunched in
        its own bundle (the epoch unchanged) meet in the round after the ended one."""
        import torch.distributed as dist

        store = _store(addr, port, rank, timeout)
        size = len(members)
        joined = store.add(f"{name}/epoch{epoch}/joined", 1)
        generation = f"{epoch}.{(joined - 1) // size}"
        own = dist.PrefixStore(f"{name}/gen{generation}", store)
        pg = dist.ProcessGroupGloo(own, rank, size, BACKEND_TIMEOUT)
        group = cls(pg, rank, members, generation, look, name, own)
        actor = _own_actor()
        if actor:  # a rank killed on a live node is named from Ray's actor table by it
            own.set(f"{ACTOR_KEY}/{rank}", actor)
        return group

    def reform(self, timeout: float = 300.0) -> GuardedGroup:
        """The next generation, formed by this rank (a survivor) once the reservation is
        ready again, its lost ranks replaced (each replacement calls :meth:`form`).
        This generation stays ended."""
        return type(self).form(timeout)

    # ------------------------------------------------------------ calls
    def all_reduce(self, tensor: Any, op: str = "sum") -> Any:
        """Reduce ``tensor`` in place over the group (``sum``, ``max``, ``min``,
        ``product``); returns it.

        Raises:
            PeerLost: a member was lost before or while it ran.
        """
        import torch.distributed as dist

        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
               "min": dist.ReduceOp.MIN, "product": dist.ReduceOp.PRODUCT}  # fmt: skip
        if op not in ops:
            raise PlacementError(f"op {op!r}: expected one of {', '.join(ops)}")
        opts = dist.AllreduceOptions()
        opts.reduceOp = ops[op]
        self._run("all_reduce", lambda: self.pg.allreduce([tensor], opts))
        return tensor

    def broadcast(self, tensor: Any, src: int = 0) -> Any:
        """``tensor`` of rank ``src``, in place on every rank; returns it."""
        import torch.distributed as dist

        if not 0 <= src < self.world_size:
            raise PlacementError(f"src {src}: expected a rank from 0 to {self.world_size - 1}")
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = src, 0
        self._run("broadcast", lambda: self.pg.broadcast([tensor], opts))
        return tensor

    def barrier(self) -> None:
        """Wait until every rank of the generation reaches it."""
        import torch.distributed as dist

        self._run("barrier", lambda: self.pg.barrier(dist.BarrierOptions()))

    @property
    def ended(self) -> PeerLost | None:
        """Why this generation ended, or None while it holds."""
        return self._ended

    def _run(self, what: str, start: Callable[[], Any]) -> None:
        if self._ended is not None:
            raise self._ended
        if self._lost:
            raise self._end(what, self._lost, "")
        work = start()
        began = time.monotonic()
        try:
            while not work.is_completed():
                if self._lost:
                    raise self._end(what, self._lost, "")
                if time.monotonic() - began > WATCH_AFTER_S:
                    self._watch()
                time.sleep(SLICE_S)
        finally:
            self._pending.clear()
        try:
            work.wait()
        except RuntimeError as e:  # the backend's own failure (a killed peer's socket)
            lost = self._lost or self._ask_once()
            raise self._end(what, lost, str(e).splitlines()[0]) from e

    def _end(self, what: str, lost: Mapping[int, str], backend: str) -> PeerLost:
        said = "; ".join(f"rank {r}: {why}" for r, why in sorted(lost.items()))
        if backend:
            said = f"{said}; gloo: {backend}" if said else f"gloo: {backend}"
        self._ended = PeerLost(
            f"{self.name} generation {self.generation}: {what} ended, a member is lost "
            f"({said or 'unknown'}); form the next generation with reform()",
            lost,
            self.generation,
        )
        if self._store is not None:  # the others hear of it (a thread: rank 0 may be gone)
            word = json.dumps({"by": self.rank, "lost": {str(r): w for r, w in lost.items()},
                               "backend": backend})  # fmt: skip
            threading.Thread(target=_say, args=(self._store, word), daemon=True).start()
        return self._ended

    def _ask_once(self) -> dict[int, str]:
        """After the backend's own failure: the verdicts, and the members whose process
        Ray reports dead (a rank killed on a live node: no verdict on its node)."""
        try:
            lost = dict(self._look(self.members, self.rank))
        except Exception:  # the backend's error is reported either way
            lost = {}
        return {**_dead_processes(self._store, self.world_size, self.rank), **lost}

    def _watch(self) -> None:
        """Look at the members, and listen for a peer's word, while a call is pending
        (one watcher and one listener a group; each on a thread of its own, since a
        look at a cut-off rank 0's store blocks)."""
        self._pending.set()
        with self._lock:
            if self._watcher is not None and self._watcher.is_alive():
                return
            self._watcher = threading.Thread(
                target=self._watching, name=f"placectl-watch-{self.generation}", daemon=True
            )
            self._watcher.start()
            if self._store is not None:
                threading.Thread(
                    target=self._listening, name=f"placectl-hear-{self.generation}", daemon=True
                ).start()

    def _listening(self) -> None:
        while self._pending.is_set() and not self._lost:
            try:
                if self._store.check([ENDED_KEY]):
                    word = json.loads(self._store.get(ENDED_KEY))
                    lost = {int(r): w for r, w in word["lost"].items() if int(r) != self.rank}
                    if word["backend"] or not lost:
                        lost.setdefault(word["by"], "")
                    by = f"said by rank {word['by']}"
                    self._lost = {r: f"{w}, {by}" if w else by for r, w in lost.items()}
                    return
            except (RuntimeError, ValueError):  # the rendezvous gone: its rank 0 with it
                self._lost = {0: "the rendezvous its process served is gone"}
                return
            time.sleep(HEARD_EVERY_S)

    def _watching(self) -> None:
        while self._pending.is_set() and not self._lost:
            try:
                lost = dict(self._look(self.members, self.rank))
            except Exception:  # the controller unreachable: no verdict, keep waiting
                time.sleep(LOOK_WAIT_S)
                continue
            if lost:
                self._lost = lost


def _own_actor() -> str:
    """This process's Ray actor id (hex), or "" outside a Ray actor."""
    import ray

    if not ray.is_initialized():
        return ""
    return ray.get_runtime_context().get_actor_id() or ""


def _dead_processes(store: Any, size: int, own: int) -> dict[int, str]:
    """The members whose actor Ray's table reports dead, by the ids they left in the
    generation's store."""
    from clients.ray_state import actor_row

    out: dict[int, str] = {}
    if store is None or not _own_actor():
        return out
    for r in range(size):
        key = f"{ACTOR_KEY}/{r}"
        try:
            if r == own or not store.check([key]):
                continue
            row = actor_row(store.get(key).decode())
        except (RuntimeError, ValueError):  # the rendezvous gone
            return {0: "the rendezvous its process served is gone"} if own != 0 else out
        if row.get("State") == "DEAD":
            out[r] = f"its process {row['Pid']} died" if row.get("Pid") else "its process died"
    return out


def _say(store: Any, word: str) -> None:
    with contextlib.suppress(RuntimeError, ValueError):  # the rendezvous gone: nobody to tell
        store.set(ENDED_KEY, word)


_SERVED: dict[tuple[str, int], Any] = {}  # the rendezvous this process serves (rank 0)


def _store(addr: str, port: int, rank: int, timeout: float) -> Any:
    """The rendezvous store at ``addr:port``. Rank 0 serves it for the process's life
    (every later generation meets there); the others connect anew each time, since the
    rank 0 they knew may be a new process now."""
    import torch.distributed as dist

    wait = datetime.timedelta(seconds=timeout)
    if rank != 0:
        return dist.TCPStore(addr, port, is_master=False, timeout=wait)
    key = (addr, port)
    if key not in _SERVED:
        _SERVED[key] = dist.TCPStore(addr, port, is_master=True, timeout=wait,
                                     wait_for_workers=False)  # fmt: skip
    return _SERVED[key]


__all__ = ["GuardedGroup", "PeerLost"]
