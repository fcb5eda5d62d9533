"""Which ranks of a worker group work is sent to, and the calls that send it: every rank
with a worker, less those lost while the group runs short (``on_loss: continue``,
:mod:`clients.short`), and, for work of one weights version, only the ranks that say they
hold it (:mod:`clients.weights`). ``WorkerGroup`` has these as its own methods."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from clients import gathering, weights
from clients.members import ControllerLook
from controller import PlacementError


class Serving:
    """The calls and the serving ranks of a ``WorkerGroup`` (its ``reservation``,
    ``component``, ``_roster`` and ``_short``: :mod:`clients.workers`)."""

    reservation: Any
    component: str

    def execute_async(
        self, method: str, *args: Any, version: int | None = None, **kwargs: Any
    ) -> list:
        """Call ``method`` on every rank; ObjectRefs in rank order.

        Args:
            version: the job's current weights version: every rank must hold it
                (:mod:`clients.weights`), or nothing is sent.

        Raises:
            PlacementError: a rank has no worker, or is lost (a group running short:
                send work to :attr:`live` or :meth:`serving`).
            StaleWeights: with ``version``, a rank does not hold it.
        """
        label = f"{self.reservation.job}/{self.component}"
        missing = [r for r, a in enumerate(self._roster.actors) if a is None]
        if missing:
            raise PlacementError(
                f"{label}: ranks {missing} have no worker (they were lost while no driver "
                "ran); repair() starts them"
            )
        if self._short.lost:
            raise PlacementError(
                f"{label}: ranks {self._short.ranks} are lost and the group runs short "
                "(on_loss: continue): send work to group.live or group.serving(version)"
            )
        if version is not None:
            weights.refuse_stale(label, list(self.live), self.versions(), version)
        return [getattr(a, method).remote(*args, **kwargs) for a in self._roster.actors]

    def execute(self, method: str, *args: Any, version: int | None = None, **kwargs: Any) -> list:
        """Call ``method`` on every rank and wait; results in rank order (``version``:
        as :meth:`execute_async`).

        Raises:
            RanksLost: a rank is lost by the controller's verdict while the call waits
                on it (its node suspected, moved off, dead or fenced; its slot moved):
                the wait ends at the verdict, not at Ray's; the others' answers are in
                the error's ``results``.
        """
        refs = self.execute_async(method, *args, version=version, **kwargs)
        got, _ = self._gather(dict(enumerate(refs)))
        return [got[r] for r in range(len(refs))]

    def _gather(
        self, refs: dict[int, Any], timeout: float | None = None
    ) -> tuple[dict[int, Any], list[int]]:
        """Wait for each rank's call until it answers or the controller's verdict says
        the rank is lost (:func:`clients.gathering.gather`)."""
        res = self.reservation
        members = [a.placement.node_id for a in self._roster.assignments]
        look = ControllerLook(res.controller, res.job, self.component, res.uid, wait_s=0.0)
        return gathering.gather(refs, members, look, f"{res.job}/{self.component}", timeout)

    # ------------------------------------------------------------ running short
    @property
    def live(self) -> dict[int, Any]:
        """The ranks to send work to, rank -> actor: every rank with a worker, but those
        lost while the group runs short (``on_loss: continue``) and not admitted back."""
        return {
            r: a
            for r, a in enumerate(self._roster.actors)
            if a is not None and r not in self._short.lost
        }

    @property
    def short(self) -> list[int]:
        """The ranks lost and not admitted back (``on_loss: continue``); empty when the
        group runs whole."""
        return self._short.ranks

    def replacements_ready(self) -> list[int]:
        """The lost ranks whose replacement has started and waits to be admitted."""
        return self._short.ready()

    def admit(self, ranks: Sequence[int] | None = None, wait_s: float = 0.0) -> list[int]:
        """Make the ready replacements of ``ranks`` (default: every ready one) ranks of
        the group again; returns those admitted. Call it just before the job's weight
        push: an admitted rank holds no weights of the job yet, and :meth:`serving`
        leaves it out until it does.

        ``wait_s``: first wait, that long at most, for the replacements of ``ranks``
        (default: every lost rank) that are not ready yet. Worth a moment where they are
        standbys being promoted (``standby: true``): a rank lost just before the push
        is then back for the next step instead of one step later."""
        if wait_s > 0:
            self._short.wait_ready(self.short if ranks is None else sorted(set(ranks)), wait_s)
        wanted = self._short.ready() if ranks is None else sorted(set(ranks))
        return self._short.admit(wanted)

    # ------------------------------------------------------------ weights versions
    def versions(self) -> dict[int, int | None]:
        """Each live rank's own word on the weights version it holds
        (:func:`clients.weights.hold`; None: none yet); a rank that does not answer
        within :data:`clients.weights.ASK_TIMEOUT_S` (dead, hung) is left out."""
        return weights.versions(self.live)

    def serving(self, version: int) -> dict[int, Any]:
        """The live ranks that hold weights ``version``, rank -> actor: those to send
        work of that version to (a promoted standby, a relaunched rank or an admitted
        replacement joins them at the job's next :meth:`push`)."""
        live = self.live
        return {r: live[r] for r, v in weights.versions(live).items() if v == version}

    def push(
        self,
        method: str,
        *args: Any,
        version: int,
        timeout: float = weights.PUSH_TIMEOUT_S,
        **kwargs: Any,
    ) -> dict[int, Any]:
        """The job's weight push: tell every live rank a load begins (it holds no
        version until its load says it does: a torn load serves nothing), call
        ``method`` (which loads the weights and calls :func:`clients.weights.hold`) on
        each, wait at most ``timeout`` seconds, and check each now says it holds
        ``version``. Returns each rank's result.

        Raises:
            PushTimeout: some loads did not finish within ``timeout`` (named).
            RanksLost: a rank is lost by the controller's verdict while its load is
                pending (as :meth:`execute`).
            StaleWeights: a rank does not say ``version`` after its load.
        """
        live = self.live
        label = f"{self.reservation.job}/{self.component}"
        began = weights.begin(live, version)
        refs = {r: getattr(a, method).remote(*args, **kwargs) for r, a in live.items()}
        try:
            got, stuck = self._gather(refs, timeout)
        finally:
            weights.settle(began)
        if stuck:
            raise weights.PushTimeout(
                f"{label}: ranks {stuck} did not finish {method}() of weights version "
                f"{version} within {timeout:g}s; they hold no version until a push to them "
                "completes (repair() or restart() them if they are stuck)"
            )
        weights.refuse_stale(label, list(live), weights.versions(live), version)
        return got

    def execute_rank(self, rank: int, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``method`` on one rank and wait for its result (``RanksLost`` at the
        controller's verdict on it, as :meth:`execute`)."""
        if not 0 <= rank < len(self._roster.actors):
            raise PlacementError(f"rank {rank}: out of range (0-{len(self._roster.actors) - 1})")
        ref = getattr(self._roster.actors[rank], method).remote(*args, **kwargs)
        got, _ = self._gather({rank: ref})
        return got[rank]
