"""What a driver or the CLI asks the controller about queues and history: what waits and
why, each queue's quota and use, who may change quotas, and what happened. Part of
:class:`clients.session.Controller`."""

from __future__ import annotations

import os

import msgspec

from clients.transport import ActorClient
from controller.state.events import Event
from controller.state.published import QueueEntry
from controller.state.queueing import QueueUsage
from controller.state.requests import EventsSince, SetOperator, SetQuota

_ENTRIES = msgspec.msgpack.Decoder(list[QueueEntry])
_USAGE = msgspec.msgpack.Decoder(list[QueueUsage])
_EVENTS = msgspec.msgpack.Decoder(list[Event])
OPERATOR_TOKEN_ENV = "PLACECTL_OPERATOR_TOKEN"


def operator_token() -> str:
    """The operator's token this client holds (``PLACECTL_OPERATOR_TOKEN``; "" if none)."""
    return os.environ.get(OPERATOR_TOKEN_ENV, "")


class QueueClient(ActorClient):
    """``queue``, ``set_quota``, ``set_operator``, ``quotas``, ``queues``, ``events``."""

    def queue(self) -> list[QueueEntry]:
        """Every queued reservation in admission order (position 1 is next), with what
        it asks for and why it waits (what is missing, and whose reservations hold it)."""
        return _ENTRIES.decode(self.call("queue"))

    def set_quota(self, queue: str, *, force: bool = False, **limits: float) -> dict[str, float]:
        """Limit what ``queue``'s admitted reservations hold together, per resource
        (``set_quota("research", GPU=16)``; no limits removes the quota). Stored in the
        table; reservations already placed keep their resources. Needs the operator's
        token (``PLACECTL_OPERATOR_TOKEN``) or ``force``; the change is in the history.

        Raises:
            NotOwner: not the operator's token, and ``force`` not given.
        """
        call = SetQuota(queue=queue, limits=limits, token=operator_token(), force=force)
        return self.call("set_quota", call)

    def set_operator(self, token: str | None = None, force: bool = False) -> str:
        """Make ``token`` (default ``PLACECTL_OPERATOR_TOKEN``) the operator's token:
        quota changes then need it. Replacing another one needs ``force``. Returns the
        first characters of its hash, as the event history names its holder.

        Raises:
            NotOwner: another operator token is set, and ``force`` not given.
        """
        token = operator_token() if token is None else token
        return self.call("set_operator", SetOperator(token=token, force=force))

    def quotas(self) -> dict[str, dict[str, float]]:
        """Every queue's quota."""
        return self.call("quotas")

    def queues(self) -> list[QueueUsage]:
        """Every queue's quota beside what its placed reservations hold and how many wait
        (queue ``""``: reservations made without a queue, which no quota limits)."""
        return _USAGE.decode(self.call("queues"))

    def events(self, job: str | None = None, after: int = 0, limit: int = 100) -> list[Event]:
        """What happened (reserved, degraded, repaired with the cause, admitted,
        preempted, applied, released, quota changes, and who acted), oldest first: the
        newest ``limit`` events of ``job`` (or of all) numbered above ``after``."""
        call = EventsSince(job=job, after=after, limit=limit)
        return _EVENTS.decode(self.call("events", call))


__all__ = ["QueueClient"]
