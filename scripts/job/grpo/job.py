"""The driver of the GRPO job: reserve, launch, train step by step, recover.

Recovery is the loop a user writes on placectl: a step that fails because a worker died
(its node was lost, it crashed) or because a survivor's collective broke is caught; every
worker group's ``repair()`` relaunches exactly its dead ranks where the reservation now
puts them; the trainer ranks re-form their process group from their current environment
and restore the last committed checkpoint; the rollout workers get its weights; the step
runs again. A restarted driver attaches to the reservation and its detached workers and
goes on from the last committed step.

``baseline=True`` does what a framework without placectl does instead: on any fault it
releases everything, reserves from nothing, relaunches every worker and restores (its
workers are not detached, so they die with their driver).

The driver talks to ``scripts/job/train.py`` over stdin/stdout: ``@step``/``@event`` lines
out, and at a scheduled fault ``@fault`` out and one line back once the fault is done.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import pathlib
import time
from typing import NamedTuple

import ray

import clients
from controller.planning.spec_edit import with_component
from grpo import calls, roles
from grpo.calls import StepTimeout, gather, split
from grpo.checkpoints import Checkpoints
from grpo.protocol import MACHINE_FAULTS, Options, fault, send
from grpo.recovery import Recovery

# Rollout on both GPUs of each of the job's four nodes: the four it had keep their GPUs
# (ranks 0-3 on GPUs 0, 2, 4, 6), the new ones take the others (explicit process ranks,
# written in resource order).
GROW = "0:0,1:4,2:1,3:5,4:2,5:6,6:3,7:7"
MAX_ATTEMPTS = 4  # recoveries of one step before the error is someone else's to read
# The job's own verdict on a step that does not finish: a worker hung inside it (stopped,
# a wedged kernel) fails nothing, so only a deadline notices. Five times the slowest step
# seen, never less than this; the first step after a launch gets the longest.
STEP_TIMEOUT_MIN_S, FIRST_STEP_TIMEOUT_S = 10.0, 120.0
# A drain's moved ranks are swapped in once their replacements are up, or when the
# node's deadline is this close, whichever comes first.
DRAIN_MARGIN_S = 10.0


class Rolled(NamedTuple):
    """A step's rollout and rewards: its batch, and the time each took."""

    step: int
    batch: list  # (target, samples, rewards) of each prompt, by prompt
    rewards: list  # each prompt's samples' rewards, by prompt
    serving: int  # rollout ranks serving when the rollout began
    rollout_s: float
    reward_s: float


class Job(Recovery):
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.ctl = clients.connect(address=opts.address)
        self.ckpt = Checkpoints(opts.checkpoints)
        self.res = None
        self.groups: dict[str, clients.WorkerGroup] = {}
        self.pending = set(map(tuple, opts.faults))
        self.pool = concurrent.futures.ThreadPoolExecutor(4)
        self.slowest = 0.0  # the slowest step this driver has seen, in seconds
        self.updates: list = []  # the trainer ranks' calls of the step in progress
        self.followed = 0  # the epoch whose moves the workers have followed
        self.preparing = 0  # the epoch whose moved ranks' replacements are starting
        self.recovered: dict = {}  # what the recovery in progress has relaunched so far
        self.fault_at = 0.0  # when the last fault this driver asked for was done
        self.rejoin_parts: dict[str, float] = {}  # the last rejoin's parts, in seconds
        self.kept: Rolled | None = None  # the batch of the step in progress, once rolled out

    # ------------------------------------------------------------ bring-up
    def _classes(self) -> dict[str, tuple]:
        cfg, ckpt = self.opts.config, self.opts.checkpoints
        if cfg.rollout == "vllm":
            from grpo.engine import Rollout as rollout
        else:
            rollout = roles.Generator
        return {
            "actor": (roles.Trainer, cfg, ckpt),
            "rollout": (rollout, cfg),
            "reward": (roles.Scorer,),
        }

    def _each(self, fn, items):
        """``fn`` over ``items`` at once (each one waits on its own workers)."""
        return dict(zip(items, self.pool.map(fn, items), strict=True))

    def _launch(self) -> None:
        detached = not self.opts.baseline

        def launch(name):
            cls, *args = self._classes()[name]
            return clients.WorkerGroup.launch(self.res, name, cls, *args, detached=detached)

        self.groups = self._each(launch, list(self._classes()))

    def _rejoin(self) -> None:
        """Every trainer rank re-forms the process group and restores the last
        committed step; every rollout worker takes its weights (:func:`calls.rejoin`)."""
        self.rejoin_parts = calls.rejoin(self.groups, self.ckpt.committed())

    def _publish_weights(self, version: int | None = None, step: int | None = None) -> None:
        """The trainers' weights of step ``version`` (the last committed) to rollout,
        admitting the replacements of rollout ranks lost meanwhile that are ready."""
        version = self.ckpt.committed() if version is None else version
        admitted = calls.publish(
            self.groups, version, lost=lambda: self._lost_rollout(step or version)
        )
        if admitted:
            send(
                "event",
                kind="admitted",
                step=step or version,
                ranks=admitted,
                short=self.groups["rollout"].short,
                at=time.time(),
            )

    def start(self) -> None:
        t0 = time.time()
        if self.opts.resume and not self.opts.baseline:
            self.res = self.ctl.reservation(self.opts.job)  # one read of the GCS
            self.res.wait_ready(timeout=300)

            def attach(name):
                cls, *args = self._classes()[name]
                group = clients.WorkerGroup.attach(self.res, name, cls, *args)
                return group, group.repair(timeout=300)  # ranks lost while no driver ran

            found = self._each(attach, list(self._classes()))
            self.groups = {n: g for n, (g, _) in found.items()}
            lost = {n: r for n, (_, r) in found.items() if r}
            self._rejoin()
            send("event", kind="attached", seconds=time.time() - t0, relaunched=lost)
            return
        if self.opts.resume:  # the baseline starts over from nothing
            spec = self._current_spec()
            self.ctl.release(self.opts.job)
        else:
            spec = self.opts.spec
        self.res = self.ctl.reserve(self.opts.job, spec, timeout_s=300)
        self._launch()
        self._rejoin()
        calls.warm_standbys(self.res, self.groups, self.opts.spec)
        send("event", kind="launched", seconds=time.time() - t0, resume=self.opts.resume)

    def _current_spec(self):
        try:
            return self.ctl.record(self.opts.job).spec
        except clients.PlacementError:
            return self.opts.spec

    # ------------------------------------------------------------ training
    def run(self) -> None:
        self.start()
        for step in range(self.ckpt.committed() + 1, self.opts.config.steps + 1):
            self._before(step)
            for attempt in itertools.count(1):
                try:
                    self._step(step)
                    break
                except (ray.exceptions.RayError, StepTimeout, clients.RanksLost) as e:
                    if attempt >= MAX_ATTEMPTS:
                        raise
                    self._recover_or_say(step, e)
        self._say_sampled()

    def _say_sampled(self) -> None:
        """What the rollout ranks serving at the end sampled, by step, in their own count
        (the run's record keeps it: a step rolled out twice shows twice its prompts)."""
        refs = [a.sampled_prompts.remote() for a in self.groups["rollout"].live.values()]
        counts: dict[int, int] = {}
        for ref in refs:
            try:  # a rank lost after the last step: its count went with it, the run stands
                done = ray.get(ref, timeout=60)
            except (ray.exceptions.RayError, TimeoutError):
                continue
            for step, n in done.items():
                counts[step] = counts.get(step, 0) + n
        send("event", kind="sampled", prompts=counts, per_step=self.opts.config.prompts)

    def _before(self, step: int) -> None:
        for group in self.groups.values():  # standbys on a spare held since (standby: true)
            group.refill_standbys()
        self._follow_moves(step)
        if ("controller", step) in self.pending:
            self.pending.discard(("controller", step))
            fault("controller", step)  # training goes on while it restarts
        if ("grow", step) in self.pending:
            self.pending.discard(("grow", step))
            fault("grow", step)  # recorded like a fault: the decision is taken now
            self._grow(step)

    def _follow_moves(self, step: int) -> None:
        """At a step boundary: if the reservation moved slots off nodes that are going
        (a drain: the old groups stay until the node's deadline, their workers running),
        start the moved ranks' replacements beside them and go on training; at the first
        boundary where every replacement is up (or the deadline is near), swap them in.
        No step is lost, and the step that swaps pays a kill and a rejoin, not a start."""
        info = self.res.refresh()
        if not info.leaving or info.epoch <= self.followed:
            return
        if self.preparing != info.epoch:
            self.preparing, started = info.epoch, time.time()
            ranks = self._each(lambda n: self.groups[n].prepare(), list(self.groups))
            send(
                "event",
                kind="preparing",
                step=step,
                ranks={n: r for n, r in ranks.items() if r},
                epoch=info.epoch,
                leaving=sorted(n[:12] for n in info.leaving),
                seconds=time.time() - started,
            )
        near = min(info.leaving.values()) - time.time() < DRAIN_MARGIN_S
        if not near and not all(g.prepared_ready() for g in self.groups.values()):
            return  # they are still starting: one more step where the workers are
        started = time.time()
        moved = self._each(lambda n: self.groups[n].sync().moved, list(self.groups))
        swapped = time.time()
        if moved["actor"]:
            self._rejoin()  # a new rank, or a new master: the group forms again
        elif any(moved.values()):
            self._publish_weights()
        self.followed = info.epoch
        send(
            "event",
            kind="moved",
            step=step,
            at=time.time(),
            moved={n: r for n, r in moved.items() if r},
            epoch=info.epoch,
            seconds=time.time() - started,
            parts={"swap": swapped - started, "rejoin": time.time() - swapped},
        )

    def _deadline(self) -> float:
        return max(STEP_TIMEOUT_MIN_S, 5 * self.slowest) if self.slowest else FIRST_STEP_TIMEOUT_S

    def _roll_out_and_score(self, step: int, timeout: float) -> Rolled:
        """The step's batch: every prompt's samples by the rollout ranks, with the weights
        of the step before (``clients.weights``), and their rewards by the reward
        workers. A rollout rank lost meanwhile is not waited for when rollout may run
        short: the others take its prompts."""
        started = time.time()
        serving = len(self.groups["rollout"].live)
        rolled = calls.roll_out(
            self.groups["rollout"],
            step,
            step - 1,
            list(range(self.opts.config.prompts)),
            timeout,
            lost=lambda: self._lost_rollout(step),
            started=lambda: self._machine_fault(step, during_rollout=True),
        )
        t_rollout = time.time()
        scorers = self.groups["reward"].actors
        parts = split(rolled, len(scorers))
        scored = gather([s.score.remote(p) for s, p in zip(scorers, parts, strict=True)], timeout)
        rewards = list(itertools.chain.from_iterable(scored))
        return Rolled(
            step=step,
            batch=[(t, samples, r) for (_, t, samples), r in zip(rolled, rewards, strict=True)],
            rewards=rewards,
            serving=serving,
            rollout_s=t_rollout - started,
            reward_s=time.time() - t_rollout,
        )

    def _step(self, step: int) -> None:
        started = time.time()
        timeout = self._deadline()
        # A batch rolled out before a trainer's loss failed this step's last attempt is
        # still this step's: it was sampled with the weights of the step before, which
        # the recovery restored. Only the update runs again.
        reused = self.kept is not None and self.kept.step == step
        if not reused:
            self.kept = self._roll_out_and_score(step, timeout)
        rolled = self.kept
        t_reward = time.time()
        self._machine_fault(step)  # mid-step: the rollouts are done, training not
        trainers = self.groups["actor"].actors
        shards = split(rolled.batch, len(trainers))
        refs = [t.train.remote(step, s) for t, s in zip(trainers, shards, strict=True)]
        self.updates = refs
        if ("driver", step) in self.pending:  # the updates are in flight: killed here
            fault("driver", step)
        losses = gather(refs, timeout)
        t_train = time.time()
        self._publish_weights(step, step)
        flat = [x for rs in rolled.rewards for x in rs]
        metrics = {
            "step": step,
            "reward": sum(flat) / len(flat),
            "exact": sum(x == 1.0 for x in flat) / len(flat),
            "loss": sum(losses) / len(losses),
            "epoch": self.res.refresh().epoch,
            "rollout_workers": rolled.serving,
            "rollout_reused": reused,
            "seconds": {
                "rollout": 0.0 if reused else rolled.rollout_s,
                "reward": 0.0 if reused else rolled.reward_s,
                "train": t_train - t_reward,
                "sync": time.time() - t_train,
            },
            "finished_at": time.time(),
        }
        self.ckpt.commit(step, metrics)
        self.kept = None
        self.slowest = max(self.slowest, time.time() - started)
        send("step", **metrics)

    # ------------------------------------------------------------ faults
    def _machine_fault(self, step: int, during_rollout: bool = False) -> None:
        """Have ``train.py`` fail a machine or a worker now, as scheduled: trainer rank
        0's node (``node``, ``crash``, ``raylet``, ``drain``, ``spot``), rank 2's
        (``hang``), or rank 1's worker process (``oom``, ``stall``); the last rank where
        there are fewer; or, while the rollout's calls are out (``during_rollout``), the
        last rollout rank's node (``rollout``). One due while that rank's node is being
        drained waits for the first step after the rank has moved off it: it strikes the
        node the rank is on."""
        for kind, due in sorted(self.pending):
            if kind not in MACHINE_FAULTS or due > step or (kind == "rollout") != during_rollout:
                continue
            if kind == "rollout":
                live = self.groups["rollout"].live
                rank = max(live)
                where = ray.get(live[rank].where.remote())
            else:
                trainers = self.groups["actor"].actors
                rank = min({"hang": 2, "oom": 1, "stall": 1}.get(kind, 0), len(trainers) - 1)
                where = ray.get(trainers[rank].where.remote())
            if where["node"] in self.res.info.leaving:
                continue
            self.pending.discard((kind, due))
            done = fault(kind, due, rank=rank, node=where["node"], pid=where["pid"], at_step=step)
            self.fault_at = done["at"]

    def _grow(self, step: int) -> None:
        """Give rollout the job's other four GPUs while everything runs."""
        started = time.time()
        trainers = [a._actor_id for a in self.groups["actor"].actors]
        started_ranks: list[int] = []
        if self.opts.baseline:  # no elastic reservation: start over with the new layout
            self._start_over(with_component(self._current_spec(), "rollout", GROW))
        else:
            self.ctl.resize(self.opts.job, "rollout", GROW)
            started_ranks = self.groups["rollout"].sync().started
            actor = self.groups["actor"].sync()
            if actor.moved or actor.started or actor.stopped:
                raise RuntimeError(f"grow touched the trainer ranks: {actor}")
            self._publish_weights()
        now = [a._actor_id for a in self.groups["actor"].actors]
        send(
            "event",
            kind="grew",
            step=step,
            rollout=len(self.groups["rollout"]),
            started=started_ranks,
            trainers_kept=sum(a == b for a, b in zip(now, trainers, strict=True)),
            epoch=self.res.refresh().epoch,
            seconds=time.time() - started,
        )


def main(opts: Options, ship_code: bool = False) -> int:
    """Drive the job. Workers import ``grpo`` from the driver's path, which Ray hands
    them (enough on the embedded cluster, or where every node shares the path);
    ``ship_code`` sends the package with the job instead, for any other cluster."""
    env = {"py_modules": [str(pathlib.Path(__file__).parent)]} if ship_code else None
    ray.init(address=opts.address, logging_level="ERROR", log_to_driver=False, runtime_env=env)
    Job(opts).run()
    send("done")
    return 0
