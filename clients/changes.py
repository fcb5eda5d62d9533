"""What a driver or the CLI asks the controller to change in a live reservation:
``apply`` and ``resize``, sent with the client's owner token. Part of
:class:`clients.session.Controller`; also where a controller call's error is unwrapped."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import ray

from controller import ClusterSpec, PlacementError, load_spec
from controller.state.change import ApplySummary

_SUMMARY = msgspec.msgpack.Decoder(ApplySummary)


def unwrap(fn: Callable[[], Any]) -> Any:
    """Run a Ray call; a PlacementError raised in the controller re-raises as itself."""
    try:
        return fn()
    except ray.exceptions.RayTaskError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, PlacementError):
            raise cause from None
        raise


class ChangeClient:
    """``apply`` and ``resize``; the controller client provides ``_actor``, ``_follow``,
    ``call`` and ``token``."""

    token: str

    def _actor(self) -> Any:  # pragma: no cover - the client's
        raise NotImplementedError

    def _follow(self, ref, job: str, progress) -> None:  # pragma: no cover - the client's
        raise NotImplementedError

    def call(self, method: str, *args: Any, timeout: float | None = None, **kw: Any) -> Any:
        raise NotImplementedError  # pragma: no cover - the client's

    def apply(
        self,
        job: str,
        spec: Any,
        timeout_s: float = 300.0,
        plan: bool = False,
        progress: Callable[[str], None] | None = None,
        force: bool = False,
    ) -> ApplySummary:
        """Give the live reservation ``job`` a new configuration, touching only what
        changes (see ``PlacementController.apply``); then bring running worker groups
        along with :meth:`WorkerGroup.sync`.

        Args:
            plan: only say what would change (per component: the ranks that stay, move,
                start and stop); nothing is changed.

        Returns:
            What changed (or would), per component and slot.

        Raises:
            ReservationError: the reservation is not ready, or the new slots could not
                be placed in time (then nothing changed).
            PlacementError: the configuration is invalid or does not fit the cluster.
        """
        spec = spec if isinstance(spec, ClusterSpec) else load_spec(spec)
        ref = self._actor().apply.remote(job, spec, timeout_s, plan, self.token, force)
        self._follow(ref, job, progress)
        return _SUMMARY.decode(unwrap(lambda: ray.get(ref)))

    def resize(
        self,
        job: str,
        component: str,
        placement: str | None = None,
        node_group: str | list[str] | None = None,
        timeout_s: float = 300.0,
        plan: bool = False,
        force: bool = False,
    ) -> ApplySummary:
        """:meth:`apply` with one component placed anew: a new placement string
        (``resize(job, "rollout", "0-15")``), other node groups (a move), or both."""
        args = (job, component, placement, node_group, timeout_s, plan, self.token, force)
        data = self.call("resize", *args)
        return _SUMMARY.decode(data)


__all__ = ["ChangeClient"]
