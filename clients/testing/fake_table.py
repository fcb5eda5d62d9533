"""The in-memory fake cluster's table as a driver reads it, for drivers tested (and
benchmarked) against :class:`clients.testing.fake_cluster.FakeCluster` without Ray."""

from __future__ import annotations

from clients.testing.fake_cluster import FakeCluster


class DriverTable:
    """The fake cluster as a driver reads it: ``clients.driver_table.RayTable``'s interface."""

    def __init__(self, fake: FakeCluster) -> None:
        self.fake = fake

    def get(self, k: bytes) -> bytes | None:
        return self.fake.kv.get(k)

    def keys(self, prefix: bytes) -> list[bytes]:
        return [k for k in self.fake.kv if k.startswith(prefix)]

    def dead_nodes(self, node_ids: list[str]) -> set[str]:
        nodes = self.fake.nodes_by_id
        return {n for n in node_ids if n not in nodes or not nodes[n].info.alive}
