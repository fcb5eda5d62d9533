"""What a driver or the CLI asks the controller to change in a live reservation:
``apply`` and ``resize``, sent with the client's owner token. Part of
:class:`clients.session.Controller`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from clients.transport import ActorClient
from controller import ClusterSpec, load_spec
from controller.state.change import ApplySummary
from controller.state.requests import Apply, Resize

_SUMMARY = msgspec.msgpack.Decoder(ApplySummary)


class ChangeClient(ActorClient):
    """``apply`` and ``resize``."""

    def apply(
        self,
        job: str,
        spec: Any,
        timeout_s: float = 300.0,
        dry_run: bool = False,
        progress: Callable[[str], None] | None = None,
        force: bool = False,
    ) -> ApplySummary:
        """Give the live reservation ``job`` a new configuration, touching only what
        changes (see ``PlacementController.apply``); then bring running worker groups
        along with :meth:`WorkerGroup.sync`.

        Args:
            dry_run: only say what would change (per component: the ranks that stay,
                move, start and stop); nothing is changed.

        Returns:
            What changed (or would), per component and slot.

        Raises:
            ReservationError: the reservation is not ready, or the new slots could not
                be placed in time (then nothing changed).
            PlacementError: the configuration is invalid or does not fit the cluster.
        """
        spec = spec if isinstance(spec, ClusterSpec) else load_spec(spec)
        call = Apply(
            job=job, spec=spec, timeout_s=timeout_s, dry_run=dry_run, token=self.token, force=force
        )
        return _SUMMARY.decode(self.follow("apply", call, job, progress))

    def resize(
        self,
        job: str,
        component: str,
        placement: str | None = None,
        node_group: str | list[str] | None = None,
        timeout_s: float = 300.0,
        dry_run: bool = False,
        force: bool = False,
    ) -> ApplySummary:
        """:meth:`apply` with one component placed anew: a new placement string
        (``resize(job, "rollout", "0-15")``), other node groups (a move), or both."""
        call = Resize(
            job=job,
            component=component,
            placement=placement,
            node_group=node_group,
            timeout_s=timeout_s,
            dry_run=dry_run,
            token=self.token,
            force=force,
        )
        return _SUMMARY.decode(self.call("resize", call))


__all__ = ["ChangeClient"]
