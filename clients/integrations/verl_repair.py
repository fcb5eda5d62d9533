"""Repair and warm standby for verl worker groups on placectl
(:class:`clients.integrations.verl.PlacectlWorkerGroup`): the promotion road of
:mod:`clients.standby`, fitted to verl's ``Worker``.

verl's ``Worker`` reads its identity from the environment in its constructor (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, as ints and strings it cannot do
without) and keeps it in its own fields. So:

* A verl standby starts with a placeholder identity: ``RANK=-1``, the group's
  ``WORLD_SIZE``, and an empty ``MASTER_ADDR`` and ``MASTER_PORT``. verl's constructor
  passes; a process group formed from that environment fails (no rank -1, no master)
  instead of joining as another rank. ``PLACECTL_STANDBY=1`` is set, as for any standby.
* Promotion writes the lost rank's environment into the standby's ``os.environ``, then
  has verl's ``_configure_with_store`` take it (the worker and, for a colocated class,
  each worker it fuses), then calls ``on_promote(env)`` if the class has one. verl's
  ``rank``, ``world_size`` and master address are the rank's from then on.

What the framework must still do is what it does after any replaced rank: form its
process group again under the new master, and reload the state its ranks keep (model
and optimizer shards). A worker whose constructor forms a process group (verl's FSDP
workers do) must not do so while ``PLACECTL_STANDBY`` is set; it can in ``on_promote``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any

import ray

from clients import verdict
from clients.launching import wait_until_ready
from clients.roster import STANDBY_NAMES_FREE_S, Roster
from clients.standby import Standbys, held_groups, key_of, promote_here, standby_name
from clients.sync import can_keep
from controller.errors import PlacementError


def standby_identity(world_size: int) -> dict[str, str]:
    """What a verl standby's constructor reads in place of a rank's identity."""
    return {"RANK": "-1", "WORLD_SIZE": str(world_size), "MASTER_ADDR": "", "MASTER_PORT": ""}


def promote_verl(instance: Any, env: dict[str, str]) -> int:
    """Run inside a verl standby (``__ray_call__``): become the rank of ``env``, in
    ``os.environ`` and in verl's own fields. Returns the process id."""
    os.environ.update(env)
    store = {
        "_world_size": int(env["WORLD_SIZE"]),
        "_rank": int(env["RANK"]),
        "_local_world_size": int(env.get("LOCAL_WORLD_SIZE", "1")),
        "_local_rank": int(env.get("LOCAL_RANK", "0")),
        "_master_addr": env["MASTER_ADDR"],
        "_master_port": env["MASTER_PORT"],
    }
    fused = getattr(instance, "fused_worker_dict", None) or {}
    for worker in (instance, *fused.values()):
        configure = getattr(worker, "_configure_with_store", None)
        if callable(configure):
            configure(store)
    return promote_here(instance, env)[0]


class VerlStandbys:
    """Repair and standbys of :class:`clients.integrations.verl.PlacectlWorkerGroup`
    (mixed into it). The group provides verl's ``resource_pool``, ``_workers``,
    ``_worker_names``, ``_master_addr`` and ``_master_port``, and placectl's
    ``verl_name(a)``, ``_start_worker(a, name, identity)`` (one verl worker in ``a``'s
    bundle) and ``_env_of(a)`` (the environment a worker of ``a`` starts with)."""

    _placectl_standbys: Standbys

    @property
    def standbys(self) -> list:
        """The standby workers on the reservation's held spares (``standby: true``)."""
        return [s[0] for s in self._placectl_standbys.running.values()]

    def _placectl_dead_ranks(self) -> list[int]:
        """The ranks Ray reports dead now: their node, or their actor."""
        pool = self.resource_pool
        nodes = pool.reservation.controller.dead_nodes(
            a.placement.node_id for a in pool.assignments
        )
        return [
            r
            for r, (a, w) in enumerate(zip(pool.assignments, self._workers, strict=True))
            if a.placement.node_id in nodes or verdict.actor_dead(w)
        ]

    def refill_standbys(self) -> list:
        """Start standbys on held spares that have none (the component says ``standby:
        true``), end those on spares no longer held; the workers started."""
        pool = self.resource_pool
        res, component = pool.reservation, pool.component
        if pool.fused or not res.spec.component(component).standby:
            return []
        wanted = res.standbys(component)
        dropped = self._placectl_standbys.drop({key_of(a) for a in wanted})
        if dropped:
            Roster.wait_names_free(
                [standby_name(res.job, component, a) for a, _ in dropped],
                within=STANDBY_NAMES_FREE_S,
            )
        started = []
        for a in wanted:
            if key_of(a) in self._placectl_standbys.running:
                continue
            name = standby_name(res.job, component, a)
            actor = self._start_worker(a, name, standby_identity(len(self._workers)))
            self._placectl_standbys.running[key_of(a)] = (actor, a, name, "")
            started.append(actor)
        return started

    def repair(self, timeout: float = 120.0, hung_after: float | None = 10.0) -> list[int]:
        """Replace exactly the ranks that are gone, as :meth:`clients.WorkerGroup.repair`
        does: wait for a verdict on silent ranks and for the reservation, then promote the
        standby in each lost rank's new bundle (verl's rank, world size and master taken
        in place, no process started) or start a verl worker there. Returns the replaced
        ranks; the job then forms its process group again and restores its state.

        Raises:
            PlacementError: a colocated group (not supported yet), or the component's
                world size changed.
        """
        started = time.monotonic()
        pool = self.resource_pool
        res, component, old = pool.reservation, pool.component, pool.assignments
        if pool.fused:
            raise PlacementError(
                "repair() of a colocated verl worker group (colocated_worker_group) is not "
                "supported yet: repair each role's group, or start the group again"
            )
        verdict.judge_group(
            self._workers,
            old,
            res,
            lambda: set(self._placectl_dead_ranks()),
            timeout,
            hung_after,
            default_say,
        )
        res.wait_ready(max(timeout - (time.monotonic() - started), 1.0))
        fresh = res.assignments(component)
        if len(fresh) != len(old):
            raise PlacementError(
                f"{res.job}/{component} has {len(fresh)} ranks now, the verl group "
                f"{len(old)}: its configuration changed; start a new worker group"
            )
        moved = {r for r, (a, b) in enumerate(zip(old, fresh, strict=True)) if not can_keep(a, b)}
        lost = sorted(moved | set(self._placectl_dead_ranks()))
        waiting, held = self._placectl_standbys, held_groups(res)
        kept = {k for k in waiting.running if k[0] in held}  # on a spare still held
        waiting.drop({key_of(fresh[r]) for r in lost} | kept)
        standing = {r: s for r in lost if (s := waiting.take(fresh[r]))}
        for r in lost:
            with contextlib.suppress(Exception):  # most are dead with their node
                ray.kill(self._workers[r], no_restart=True)
        Roster.wait_names_free([self._worker_names[r] for r in lost if r not in standing])
        promotions, new = {}, []
        for r in lost:
            if r in standing:
                actor, _, name, _ = standing[r]
                promotions[r] = actor.__ray_call__.remote(promote_verl, self._env_of(fresh[r]))
            else:
                name = self.verl_name(fresh[r])
                actor = self._start_worker(fresh[r], name, {})
                new.append(actor)
            self._workers[r], self._worker_names[r] = actor, name
        for r, ref in promotions.items():  # each standby is its rank now
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:  # it died meanwhile: a start after all
                name = self.verl_name(fresh[r])
                self._workers[r] = self._start_worker(fresh[r], name, {})
                self._worker_names[r] = name
                new.append(self._workers[r])
        if new:
            left = max(timeout - (time.monotonic() - started), 1.0)
            wait_until_ready(new, f"{res.job}/{component} (verl)", left)
        self._master_addr = fresh[0].env["MASTER_ADDR"]
        self._master_port = fresh[0].env.get("MASTER_PORT")
        pool.assignments = fresh
        self.refill_standbys()
        return lost


def default_say(message: str) -> None:
    print(f"placectl: {message}", file=sys.stderr, flush=True)
