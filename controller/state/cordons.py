"""Nodes an operator took out of placement (``placectl cordon``, ``placectl drain``).

A cordoned node gets no new slot: no plan, spare or repair picks it, while the slots
already there stay. A drained one is cordoned and, besides, every reservation with a
slot there moves off it, make before break, as for Ray's own drain (a spot notice): the
replacement is placed and ready before the old group goes. Unlike Ray's drain, the node
stays in the cluster for other work, and ``placectl uncordon`` gives it back.

Kept in the table (one key per node), so a controller restart keeps them.
"""

from __future__ import annotations

import msgspec


class Cordon(msgspec.Struct, frozen=True, kw_only=True):
    """One node out of placement, and why.

    Attributes:
        node_id: the node (Ray's id).
        ip: its address when cordoned, as operators name nodes.
        drain: its slots move off too (not only new ones kept away).
        why: the operator's reason, shown in ``placectl status`` and the history.
        at: when (wall-clock seconds).
    """

    node_id: str
    ip: str = ""
    drain: bool = False
    why: str = ""
    at: float = 0.0

    def where(self) -> str:
        """``10.0.0.3 (1a2b3c4d5e6f)``."""
        return f"{self.ip} ({self.node_id[:12]})" if self.ip else self.node_id[:12]

    def shown(self) -> str:
        """``10.0.0.3 (1a2b3c4d5e6f) drained: a GPU throws Xid 79``."""
        how = "drained" if self.drain else "cordoned"
        return f"node {self.where()} {how}" + (f": {self.why}" if self.why else "")


def resolve(name: str, nodes: dict[str, str], what: str = "alive") -> str:
    """The node id ``name`` names among ``nodes`` (node id -> address), the ``what``
    nodes: a full id, a unique prefix of one (8 characters at least), or an address
    held by one node.

    Raises:
        ValueError: no node, or more than one, answers to ``name``; the message says
            what names are taken.
    """
    if name in nodes:
        return name
    by_ip = [n for n, ip in nodes.items() if ip == name]
    if len(by_ip) == 1:
        return by_ip[0]
    if len(by_ip) > 1:
        ids = ", ".join(sorted(n[:12] for n in by_ip))
        raise ValueError(
            f"node {name!r}: {len(by_ip)} {what} nodes have that address ({ids}); "
            "name one by its id"
        )
    if len(name) >= 8:
        by_id = [n for n in nodes if n.startswith(name)]
        if len(by_id) == 1:
            return by_id[0]
        if len(by_id) > 1:
            raise ValueError(f"node {name!r}: the prefix of {len(by_id)} node ids; give more of it")
    raise ValueError(
        f"node {name!r}: no {what} node has that id or address; expected a node id (or its "
        "first 8 characters or more) or an address, as `ray list nodes` shows them"
    )


__all__ = ["Cordon", "resolve"]
