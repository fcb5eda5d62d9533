"""How the GRPO job's driver recovers a step that failed: every group's ``repair()``
(rollout that runs short only finds what it lost), trainer ranks stuck on a vanished peer
restarted, the group re-formed from the last committed checkpoint; or, for the baseline,
everything started over. ``grpo.job.Job`` has these as its own methods."""

from __future__ import annotations

import time

import ray

import clients
from grpo.calls import StepTimeout, cause_of, promoted, standing
from grpo.protocol import send

# repair(): a rank silent this long on a live node is hung and replaced.
HUNG_AFTER_S = 5.0
# A trainer rank whose update of the failed step has not ended this long after the repair
# is blocked in a collective with a peer that vanished without closing its connections
# (a hung or unplugged machine): gloo would wait out its timeout; it is restarted instead.
COLLECTIVE_GRACE_S = 3.0


class Recovery:
    """The recovery of a ``Job`` (its ``opts``, ``ctl``, ``res``, ``groups``, ``updates``,
    ``recovered`` and ``fault_at``, and its ``_each``, ``_launch``, ``_rejoin`` and
    ``_current_spec``: :mod:`grpo.job`)."""

    def _lost_rollout(self, step: int) -> None:
        """A rollout rank's call failed as one whose worker is gone, and rollout may run
        short (``on_loss: continue``): the group finds what is lost, at once."""
        started = time.time()
        group = self.groups["rollout"]
        lost = group.repair(timeout=300, hung_after=HUNG_AFTER_S)
        if lost:
            send(
                "event",
                kind="short",
                step=step,
                lost=lost,
                serving=len(group.live),
                seconds=time.time() - started,
                detected=started - self.fault_at if self.fault_at else None,
            )

    def _stuck(self, relaunched: list[int]) -> list[int]:
        """Trainer ranks still inside the failed step's update after a grace: blocked in
        a collective on a peer that vanished without a word."""
        live = [(r, ref) for r, ref in enumerate(self.updates) if r not in relaunched]
        if not live:
            return []
        refs = [ref for _, ref in live]
        ray.wait(refs, num_returns=len(refs), timeout=COLLECTIVE_GRACE_S)
        done = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
        return [r for r, ref in live if ref not in done]

    def _start_over(self, spec) -> None:
        """What a framework without placectl does: release everything, reserve ``spec``
        from nothing, launch every worker again and restore the last checkpoint."""
        for g in self.groups.values():
            g.shutdown()
        self.ctl.release(self.opts.job)
        self.res = self.ctl.reserve(self.opts.job, spec, timeout_s=300)
        self._launch()
        self._rejoin()

    def _recover_or_say(self, step: int, error: Exception) -> None:
        """Recover; a recovery that fails itself (a worker lost again meanwhile, a group
        that could not form) is said, and left to the step's next attempt, which fails
        at once and recovers again: what a job does on a cluster that keeps failing."""
        started, self.recovered = time.time(), {}
        try:
            self._recover(step, error, started)
        except (ray.exceptions.RayError, StepTimeout, clients.PlacementError) as e:
            send(
                "event",
                kind="recovery failed",
                step=step,
                cause=cause_of(e),
                seconds=time.time() - started,
                **self.recovered,  # what it did before it failed
            )

    def _recover(self, step: int, error: Exception, started: float) -> None:
        cause = cause_of(error)
        if self.opts.baseline:
            self._start_over(self._current_spec())
            send("event", kind="restarted", step=step, cause=cause, seconds=time.time() - started)
            return
        # No wait for the whole reservation: each group's repair() waits for its own
        # slots, so a rollout node that waits for a node to join (its ranks running
        # short) holds no trainer's repair back.
        self.recovered = {"relaunched": {}, "promoted": {}, "restarted": []}
        before = standing(self.groups)

        def repair(name: str) -> list[int]:
            ranks = self.groups[name].repair(timeout=300, hung_after=HUNG_AFTER_S)
            if ranks and self.res.spec.component(name).runs_short:  # lost, none relaunched
                self.recovered.setdefault("short", {})[name] = ranks
                return []
            if ranks:  # said even if another group's repair fails: these ranks are new
                self.recovered["relaunched"][name] = ranks
                self.recovered["promoted"].update(promoted(self.groups, {name: ranks}, before))
            return ranks

        relaunched = self._each(repair, list(self.groups))
        stuck = self._stuck(relaunched["actor"])
        if stuck:
            self.groups["actor"].restart(stuck)
        self.recovered["restarted"] = stuck
        self.updates = []
        restarted = time.time()
        self._rejoin()
        send(
            "event",
            kind="repaired",
            step=step,
            cause=cause,
            relaunched={n: r for n, r in relaunched.items() if r},
            promoted=self.recovered["promoted"],
            short=self.recovered.get("short", {}),
            restarted=stuck,
            epoch=self.res.epoch,
            seconds=time.time() - started,
            detected=started - self.fault_at if self.fault_at else None,
            rejoin=self.rejoin_parts,
            parts={
                "workers": restarted - started,  # the slots' repair included
                "rejoin": time.time() - restarted,
            },
        )
