"""Whether the controller may act: it has recovered, and its table can be read."""

from __future__ import annotations

import asyncio
import logging

from controller.errors import ReservationError, TableUnreadable
from controller.state.table import where

log = logging.getLogger("placectl.controller")

RECOVERY_WAIT_S = 60.0


class Readiness:
    """The gate every call but the diagnostic ones passes.

    Attributes:
        recovered: set once recovery ended (with the table read, or refused).
        refusal: why the table cannot be read (None: it can, or recovery has not ended).
        problem: the last reason recovery failed, told to calls that time out on it.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self.recovered = asyncio.Event()
        self.refusal: str | None = None
        self.problem = ""

    def accept(self) -> None:
        if self.refusal is not None:
            log.warning("the reservation table is readable again; acting on it")
        self.refusal = None
        self.recovered.set()

    def refuse(self, why: str) -> None:
        """Refuse every call with ``why`` (calls answer now: with the refusal)."""
        if why != self.refusal:
            log.error("refusing to act: the reservation table cannot be read: %s", why)
        self.refusal = why
        self.recovered.set()

    async def wait(self) -> None:
        """Wait for recovery (at most ``RECOVERY_WAIT_S``); refuse while the table cannot
        be read."""
        if not self.recovered.is_set():
            try:
                await asyncio.wait_for(self.recovered.wait(), RECOVERY_WAIT_S)
            except asyncio.TimeoutError:
                raise ReservationError(
                    f"the controller has not recovered after {RECOVERY_WAIT_S:g}s: {self.problem}"
                ) from None
        if self.refusal is not None:
            raise TableUnreadable(
                f"placectl refuses to act because the reservation table cannot be read: "
                f"{self.refusal}. Nothing was removed; run a placectl that reads it, or "
                f"remove the unreadable keys ({where(self._name)})"
            )
