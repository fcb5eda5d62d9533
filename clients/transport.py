"""A driver's line to the controller actor: the handle, how a call reaches it (and a
replaced controller is found again), how its errors come back, and the owner token the
changes carry. :class:`clients.session.Controller` and the calls it groups
(:mod:`clients.changes`, :mod:`clients.queue`) build on it."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

import msgspec
import ray

from clients.owner_token import resolve_token
from clients.versions import warn_if_versions_differ
from controller import PlacementError

DEFAULT_NAME = "placectl"
DEFAULT_NAMESPACE = "placectl"


def unwrap(fn: Callable[[], Any]) -> Any:
    """Run a Ray call; a PlacementError raised in the controller re-raises as itself."""
    try:
        return fn()
    except ray.exceptions.RayTaskError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, PlacementError):
            raise cause from None
        raise


class ActorClient:
    """The handle to a named controller actor and the calls made through it.

    Each call sends one request of :mod:`controller.state.requests` (or none), built by
    keyword and sent by field name, so a parameter is named where the request type
    names it, and a bad one is refused here before it travels (and there again).
    """

    def __init__(
        self,
        handle: Any = None,
        name: str = DEFAULT_NAME,
        namespace: str = DEFAULT_NAMESPACE,
        token: str | None = None,
    ) -> None:
        self.handle = handle
        self.name = name
        self.namespace = namespace
        self._token = token
        self._version_checked = False

    @property
    def token(self) -> str:
        """The owner token this client sends with every change (resolved on first use)."""
        if not self._token:
            self._token = resolve_token()
        return self._token

    def _actor(self) -> Any:
        """The controller actor's handle, looked up on first use by a Controller made
        for reading the table only."""
        if self.handle is None:
            self.handle = ray.get_actor(self.name, namespace=self.namespace)
        return self.handle

    def call(self, method: str, request: Any = None, timeout: float | None = None) -> Any:
        """Call one of the controller actor's methods with its ``request`` (None: a call
        without parameters) and wait; a PlacementError it raises is raised here as
        itself."""
        try:
            out = self._call_once(method, request, timeout)
        except ray.exceptions.ActorDiedError:
            if not self._found_anew():
                raise
            out = self._call_once(method, request, timeout)  # calls are idempotent
        if not self._version_checked:  # once per client, after its first call answered
            self._version_checked = True
            with contextlib.suppress(Exception):  # a check, never a reason for a call to fail
                health = out if method == "health" else self.call("health")
                warn_if_versions_differ(health.get("version", "unknown"))
        return out

    def _call_once(self, method: str, request: Any, timeout: float | None) -> Any:
        ref = self._send(method, request)
        return unwrap(lambda: ray.get(ref, timeout=timeout))

    def _send(self, method: str, request: Any) -> Any:
        """The request goes by field name; the controller builds it again, and checks it."""
        fields = {} if request is None else msgspec.structs.asdict(request)
        return getattr(self._actor(), method).remote(**fields)

    def _found_anew(self) -> bool:
        """The controller this handle named was stopped and another started under its
        name (an upgrade: `placectl stop`, `placectl start`): use the new one."""
        try:
            new = ray.get_actor(self.name, namespace=self.namespace)
        except ValueError:
            return False
        if self.handle is not None and new._actor_id == self.handle._actor_id:
            return False
        self.handle = new
        return True

    def follow(
        self, method: str, request: Any, job: str, progress: Callable[[str], None] | None
    ) -> Any:
        """Call ``method`` with ``request`` and wait for it, passing what the controller
        says it waits for to ``progress`` (default: stderr) whenever that changes."""
        ref = self._send(method, request)
        say = progress or (lambda m: print(f"placectl: {job}: {m}", file=sys.stderr, flush=True))
        last = ""
        while not ray.wait([ref], timeout=1.0)[0]:
            try:
                message = ray.get(self.handle.progress.remote(job), timeout=5)
            except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
                continue
            if message and message != last:
                say(message)
                last = message
        return unwrap(lambda: ray.get(ref))

    def check_alive(self) -> str:
        """Round-trip to the controller; returns its incarnation id (new on each restart)."""
        return self.call("check_alive")

    def health(self) -> dict[str, Any]:
        """The controller's incarnation, whether it has recovered, why it refuses to act
        if it does (an unreadable table), and each reservation's steps (``steps``: the
        one running, then those waiting)."""
        return self.call("health")


__all__ = ["DEFAULT_NAME", "DEFAULT_NAMESPACE", "ActorClient", "unwrap"]
