"""Tables as older placectl versions wrote them, rebuilt from today's records: what the
migration tests and the chaos run's restart-onto-an-old-table fault write into the GCS."""

from __future__ import annotations

import msgspec

from controller.planning.cluster import ClusterView
from controller.state.records import ReservationRecord


def v1_view(record: ReservationRecord, live):
    """The full cluster view placectl 0.1 kept with a record: its own nodes at their node
    ranks, other nodes of ``live`` (a ClusterView) filling the other ranks."""

    mine = {n.node_id for n in record.nodes.values()}
    others = [n for n in live.nodes if n.node_id not in mine]
    size = max([*record.nodes, len(live.nodes) - 1, record.spec.num_nodes - 1]) + 1
    like = next((n for n in record.nodes.values() if n.num_gpus), None)
    nodes = []
    for rank in range(size):
        if rank in record.nodes:
            nodes.append(record.nodes[rank])
        elif others:
            nodes.append(others.pop(0))
        else:  # a node that has left the cluster since
            nodes.append(msgspec.structs.replace(like, node_id=f"departed{rank}", ip=""))
    return ClusterView(nodes=nodes)


def v1_table(records: dict[str, ReservationRecord], view) -> bytes:
    """The bytes placectl 0.1 would have stored for these reservations: one key, table
    version 1, each record with the full cluster view it was planned on (rebuilt from
    ``view``, the live cluster). Its schema is checked against a table 0.1 really wrote
    (tests/unit/data/table_v1.msgpack)."""
    table = {
        "version": 1,
        "reservations": {
            job: {
                "job": job,
                "spec": msgspec.to_builtins(r.spec),
                "view": msgspec.to_builtins(v1_view(r, view)),
                "floating": r.floating,
                "slots": [
                    {
                        "node_rank": s.node_rank,
                        "node_id": s.node_id,
                        "node_ip": s.node_ip,
                        "group_name": s.group_name,
                        "group_id": s.group_id,
                        "bundles": [
                            {
                                "kind": b.kind,
                                "local_index": b.local_index,
                                "resources": b.resources,
                                "physical_id": b.physical_id,
                            }
                            for b in s.bundles
                        ],
                    }
                    for s in r.slots
                ],
                "state": r.state,
                "epoch": r.epoch,
                "created_at": r.created_at,
                "reason": r.reason,
                "leases": msgspec.to_builtins(r.leases),
            }
            for job, r in records.items()
        },
    }
    return msgspec.msgpack.encode(table)


def rewrite_as_v1(controller_name: str, data: bytes, keep: tuple[bytes, ...] = ()) -> None:
    """Put the GCS back the way placectl 0.1 left it: the controller's table as the one
    key ``data`` (from :func:`v1_table`), every other key of it deleted but those starting
    with one of ``keep`` (a quota, as if set after the upgrade)."""
    from ray.experimental import internal_kv

    from controller.state.table import KV_NAMESPACE, LEGACY_KEY, kv_prefix

    prefix = kv_prefix(controller_name)
    for k in internal_kv._internal_kv_list(prefix, namespace=KV_NAMESPACE):
        if not any(k.startswith(prefix + kept) for kept in keep):
            internal_kv._internal_kv_del(k, namespace=KV_NAMESPACE)
    internal_kv._internal_kv_put(prefix + LEGACY_KEY, data, namespace=KV_NAMESPACE)
