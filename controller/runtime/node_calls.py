"""The controller's calls about nodes an operator takes out of placement: ``cordon``
(with ``drain``, its slots move off too), ``uncordon`` and ``cordons``
(:mod:`controller.state.cordons`)."""

from __future__ import annotations

from controller.errors import ReservationError
from controller.runtime import tasks
from controller.runtime.history import acting_as, client
from controller.runtime.operations import Operations
from controller.runtime.queue_calls import operator_may
from controller.state.cordons import Cordon, resolve
from controller.state.owners import owner_hash
from controller.state.requests import CordonNode, UncordonNode


class NodeCalls:
    """Answers ``cordon``, ``uncordon`` and ``cordons``. A cordon is written to the table
    before the node view leaves the node out; the loop moves a drained node's slots at
    its next tick, as for a node Ray drains."""

    def __init__(self, ops: Operations) -> None:
        self._state, self._nodes = ops.ctx.state, ops.ctx.nodes

    async def cordon(self, call: CordonNode) -> dict:
        """Take ``call.node`` out of placement (and drain it); returns the cordon.

        Raises:
            NotOwner: not the operator's token, and not ``force``.
            ReservationError: no alive node, or several, answer to the name.
        """
        node = self._resolve(call.node, alive=True)
        how = "draining" if call.drain else "cordoning"
        forced = operator_may(
            self._state.operator, call.token, call.force, f"{how} node {call.node!r} refused"
        )
        info = self._nodes.info(node)
        cordon = Cordon(
            node_id=node,
            ip=info.ip if info else "",
            drain=call.drain,
            why=call.why,
            at=tasks.wall(),
        )
        with acting_as(client(owner_hash(call.token), forced)):
            await self._state.set_cordon(node, cordon, cordon.shown())
        self._refresh()
        moving = sorted(self._state.jobs_on(node)) if call.drain else []
        return {**_shown(cordon), "moving": moving}

    async def uncordon(self, call: UncordonNode) -> dict:
        """Give ``call.node`` back to placement; returns the cordon lifted.

        Raises:
            NotOwner: not the operator's token, and not ``force``.
            ReservationError: no cordoned node answers to the name.
        """
        node = self._resolve(call.node, alive=False)
        forced = operator_may(
            self._state.operator, call.token, call.force, f"uncordoning node {call.node!r} refused"
        )
        cordon = self._state.cordons[node]
        with acting_as(client(owner_hash(call.token), forced)):
            await self._state.set_cordon(node, None, f"node {cordon.where()} uncordoned")
        self._refresh()
        return _shown(cordon)

    async def cordons(self) -> list[dict]:
        """Every node out of placement, oldest first."""
        return [_shown(c) for c in sorted(self._state.cordons.values(), key=lambda c: c.at)]

    def _refresh(self) -> None:
        self._nodes.set_cordoned(self._state.cordons)

    def _resolve(self, name: str, alive: bool) -> str:
        if alive:
            alive = self._nodes.alive_ids()
            nodes = {n: (i.ip if (i := self._nodes.info(n)) else "") for n in alive}
        else:  # a cordoned node may be gone since
            nodes = {n: c.ip for n, c in self._state.cordons.items()}
        try:
            return resolve(name, nodes, "alive" if alive else "cordoned")
        except ValueError as e:
            if not alive and not nodes:
                raise ReservationError(f"node {name!r}: no node is cordoned") from None
            raise ReservationError(str(e)) from None


def _shown(c: Cordon) -> dict:
    return {"node": c.node_id, "ip": c.ip, "drain": c.drain, "why": c.why, "at": c.at}


__all__ = ["NodeCalls"]
