"""What an operator asks the controller about nodes: take one out of placement
(``cordon``; with ``drain``, move every slot there off it, make before break), declare
one broken now (``fence``: every slot there replaced at once), give it back
(``uncordon``), and list them (``cordons``). Part of
:class:`clients.session.Controller`."""

from __future__ import annotations

from clients.queue import operator_token
from clients.transport import ActorClient
from controller.state.requests import CordonNode, UncordonNode


class NodeClient(ActorClient):
    """``cordon``, ``fence``, ``uncordon``, ``cordons``."""

    def cordon(self, node: str, *, drain: bool = False, why: str = "", force: bool = False) -> dict:
        """Place no new slot on ``node`` (its id, the first 8 characters of it or more,
        or its address): no reservation, spare or repair picks it. With ``drain``, every
        reservation with a slot there (and automatic repair) moves off it too, make
        before break, as when Ray drains a node; ``WorkerGroup.sync()`` then moves the
        ranks at a step boundary. The node stays in Ray. Stored in the table; needs the
        operator's token (``PLACECTL_OPERATOR_TOKEN``) or ``force``. Returns the cordon
        (``node``, ``ip``, ``drain``, ``why``, ``at``) and the reservations ``moving``.

        Raises:
            NotOwner: not the operator's token, and ``force`` not given.
            ReservationError: no alive node, or more than one, answers to ``node``.
        """
        call = CordonNode(node=node, drain=drain, why=why, token=operator_token(), force=force)
        return self.call("cordon", call)

    def fence(self, node: str, *, why: str = "", force: bool = False) -> dict:
        """Declare ``node`` broken now (a GPU that throws Xid errors, a machine about to
        be pulled): it is cordoned, then told dead to Ray's GCS, so its raylet exits and
        every process there ends, and every reservation with a slot there is repaired
        at once (its slots replaced, break before make), as for a node that died.
        ``WorkerGroup.repair()`` then relaunches, or promotes standbys for, its ranks.
        A raylet started there again registers as a new node. Needs the operator's
        token (``PLACECTL_OPERATOR_TOKEN``) or ``force``. Returns the cordon and the
        reservations ``moving``.

        Raises:
            NotOwner: not the operator's token, and ``force`` not given.
            ReservationError: no alive node, or more than one, answers to ``node``; it
                is the head or the controller's own node; Ray refused the fence (the
                node stays cordoned).
        """
        call = CordonNode(node=node, fence=True, why=why, token=operator_token(), force=force)
        return self.call("cordon", call)

    def uncordon(self, node: str, *, force: bool = False) -> dict:
        """Let ``node`` take new slots again (slots moved off it stay where they are).
        Returns the cordon lifted.

        Raises:
            NotOwner: not the operator's token, and ``force`` not given.
            ReservationError: no cordoned node answers to ``node``.
        """
        return self.call("uncordon", UncordonNode(node=node, token=operator_token(), force=force))

    def cordons(self) -> list[dict]:
        """Every node out of placement, oldest first."""
        return self.call("cordons")


__all__ = ["NodeClient"]
