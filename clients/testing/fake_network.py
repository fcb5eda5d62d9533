"""The fake cluster's network (:class:`clients.testing.fake_cluster.FakeCluster` holds it):
nodes cut off both ways, single paths down, and what a node sees of the others' raylets
from where it stands, the controller's own node or a witness's
(:mod:`controller.runtime.core.evidence`)."""

from __future__ import annotations

import collections


class FakeNetwork:
    """Who reaches whom. Mixed into the fake cluster, which has ``nodes_by_id``,
    ``own_node()`` and ``_cost()``.

    Attributes:
        cut: nodes cut off both ways: nobody reaches them, they reach nobody. The
            controller's own node among them: it reaches no one.
        links_down: ``{a, b}``: the path between two nodes only.
        witnessed: witness node -> how often it was asked.
        kept_witnesses: the nodes the controller keeps a witness standing on.
    """

    def __init__(self) -> None:
        self.cut: set[str] = set()
        self.links_down: set[frozenset[str]] = set()
        self.witnessed: collections.Counter[str] = collections.Counter()
        self.kept_witnesses: list[str] = []

    def keep_witnesses(self, node_ids: list[str]) -> None:
        self.kept_witnesses = list(node_ids)

    def _seen_from(self, where: str, addresses) -> dict[str, str]:
        nodes = self.nodes_by_id
        return {
            n: "silent"
            if where in self.cut or n in self.cut or frozenset((where, n)) in self.links_down
            else (nodes[n].raylet if n in nodes else "refused")
            for n in addresses
        }

    async def witness_answers(
        self, witness: str, addresses: dict[str, str], timeout: float, ways: int = 1
    ) -> dict[str, str] | None:
        self._cost("witness", self.latency.gcs_rtt)
        self.witnessed[witness] += 1
        node = self.nodes_by_id.get(witness)
        if self.own_node() in self.cut or witness in self.cut or node is None:
            return None  # the task never reaches it, or its reply never comes back
        if not node.info.alive or node.raylet != "ok":
            return None
        return self._seen_from(witness, addresses)
