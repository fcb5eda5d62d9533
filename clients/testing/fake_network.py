"""The fake cluster's network (:class:`clients.testing.fake_cluster.FakeCluster` holds it):
who reaches whom, and what a node sees of the others' raylets from where it stands, the
controller's own node or a witness's (:mod:`controller.runtime.core.evidence`).

The faults are the ones real networks have, in the form they take:

* ``cut``: nodes cut off both ways (a cable unplugged): nobody reaches them, they reach
  nobody. The controller's own node among them: it reaches no one.
* ``links_down``: the path between two nodes only (``{a, b}``).
* :meth:`FakeNetwork.split`: a two-sided partition (a rack's uplink down): each side
  reaches itself, neither the other, and nothing on either side answers a refusal.
* ``lossy``: a node's link losing a share of packets: each look at its raylet is lost
  with that probability (seeded), so one asked over several connections answers if any
  one does.
* ``rejecting``: ``(from, to)`` paths where a firewall rejects: a connection from
  ``from`` to ``to``'s raylet is refused, though the node runs (a REJECT rule, a TCP
  reset): a refusal that is the network's, not the node's.
"""

from __future__ import annotations

import asyncio
import collections
import random

SECOND = "#second"  # the suffix of a node's second port in a question (liveness)


class FakeNetwork:
    """Who reaches whom. Mixed into the fake cluster, which has ``nodes_by_id``,
    ``own_node()`` and ``_cost()``.

    Attributes:
        cut: nodes cut off both ways.
        links_down: ``{a, b}``: the path between two nodes only.
        sides: the sides of a two-sided split (:meth:`split`), empty when none.
        lossy: node -> the share of looks at its raylet lost.
        rejecting: ``(from, to)`` paths on which connections are refused.
        witnessed: witness node -> how often it was asked.
        witness_calls: how many witness questions were asked (each may cover several
            nodes).
        kept_witnesses: the nodes the controller keeps a witness standing on.
        standing: node -> the witness standing there (a token: one killed and started
            anew is another) and when it is ready to ask (loop time). A witness answers
            only from where one stands: a question to a node with none starts one there
            (``latency.witness_start``), as Ray starts an actor.
        ended_asking: witnesses killed with a question in flight (their replies lost).
        witness_starts: node -> how often a witness was started there.
    """

    def __init__(self, seed: int = 0) -> None:
        self.cut: set[str] = set()
        self.links_down: set[frozenset[str]] = set()
        self.sides: list[set[str]] = []
        self.lossy: dict[str, float] = {}
        self.rejecting: set[tuple[str, str]] = set()
        self.witnessed: collections.Counter[str] = collections.Counter()
        self.witness_calls = 0
        self.kept_witnesses: list[str] = []
        self.standing: dict[str, tuple[object, float]] = {}
        self.ended_asking = 0
        self.witness_starts: collections.Counter[str] = collections.Counter()
        self._asking: collections.Counter[str] = collections.Counter()
        self._luck = random.Random(seed)

    def split(self, *sides: set[str]) -> None:
        """Split the cluster: each of ``sides`` reaches itself only; the nodes in none
        of them form one more side. ``split()`` heals it."""
        self.sides = [set(s) for s in sides]

    def heal(self) -> None:
        """Every fault of the network gone."""
        self.cut.clear()
        self.links_down.clear()
        self.sides = []
        self.lossy.clear()
        self.rejecting.clear()

    def _side(self, node: str) -> int:
        return next((i for i, s in enumerate(self.sides) if node in s), -1)

    def reaches(self, a: str, b: str) -> bool:
        """Whether a connection from node ``a`` gets to node ``b`` (loss aside)."""
        if a == b:
            return True
        if a in self.cut or b in self.cut or frozenset((a, b)) in self.links_down:
            return False
        return self._side(a) == self._side(b)

    def keep_witnesses(self, node_ids: list[str], away: set[str] = frozenset()) -> None:
        self.kept_witnesses = list(node_ids)
        for gone in set(self.standing) - set(node_ids) - set(away):
            del self.standing[gone]  # killed: a question it is asking gets no reply
            self.ended_asking += self._asking[gone]
        for n in node_ids:
            self._stand(n)

    def _stand(self, node: str) -> tuple[object, float]:
        """The witness on ``node``, started there now if none stands."""
        if node not in self.standing:
            ready = asyncio.get_running_loop().time() + self.latency.witness_start
            self.standing[node] = (object(), ready)
            self.witness_starts[node] += 1
        return self.standing[node]

    def _seen_from(self, where: str, addresses, ways: int | dict = 1) -> dict[str, str]:
        """What node ``where`` finds at each raylet of ``addresses`` (node ids, or a
        node id with :data:`SECOND` for its second port)."""
        nodes = self.nodes_by_id
        out = {}
        for key in addresses:
            n = key.removesuffix(SECOND)
            looks = ways if isinstance(ways, int) else ways.get(key, 1)
            if n not in nodes or (where, n) in self.rejecting:
                out[key] = "refused"
            elif not self.reaches(where, n):
                out[key] = "silent"
            elif any(self._luck.random() < self.lossy[x] for x in (where, n) if x in self.lossy):
                lost = all(
                    any(self._luck.random() < self.lossy[x] for x in (where, n) if x in self.lossy)
                    for _ in range(max(1, looks) - 1)
                )
                out[key] = "silent" if lost else nodes[n].raylet
            else:
                out[key] = nodes[n].raylet
        return out

    async def witness_answers(
        self, witness: str, addresses: dict[str, str], timeout: float, ways: int = 1
    ) -> dict[str, str] | None:
        self._cost("witness", self.latency.gcs_rtt)
        self.witnessed[witness] += 1
        self.witness_calls += 1
        token, ready = self._stand(witness)
        self._asking[witness] += 1
        try:  # a witness started for the question asks once its process is up
            await asyncio.sleep(max(0.0, ready - asyncio.get_running_loop().time()))
        finally:
            self._asking[witness] -= 1
        if self.standing.get(witness, (None,))[0] is not token:
            return None  # killed while it asked
        node = self.nodes_by_id.get(witness)
        if node is None or not self.reaches(self.own_node(), witness):
            return None  # the task never reaches it, or its reply never comes back
        if not node.info.alive or node.raylet != "ok":
            return None
        return self._seen_from(witness, addresses, ways)
