"""What a driver or the CLI asks the controller about its queue: what waits and why, and
each queue's quota. Part of :class:`clients.session.Controller`."""

from __future__ import annotations

from typing import Any

import msgspec

from controller.state.status import QueueEntry

_ENTRIES = msgspec.msgpack.Decoder(list[QueueEntry])


class QueueClient:
    """``queue``, ``set_quota``, ``quotas``; the controller client provides ``call``."""

    def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        raise NotImplementedError  # pragma: no cover - the client's

    def queue(self) -> list[QueueEntry]:
        """Every queued reservation in admission order (position 1 is next), with what
        it asks for and why it waits (what is missing, and whose reservations hold it)."""
        return _ENTRIES.decode(self.call("queue"))

    def set_quota(self, queue: str, **limits: float) -> dict[str, float]:
        """Limit what ``queue``'s admitted reservations hold together, per resource
        (``set_quota("research", GPU=16)``; no limits removes the quota). Stored in the
        table; reservations already placed keep their resources."""
        return self.call("set_quota", queue, limits)

    def quotas(self) -> dict[str, dict[str, float]]:
        """Every queue's quota."""
        return self.call("quotas")


__all__ = ["QueueClient"]
