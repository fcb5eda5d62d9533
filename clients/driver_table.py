"""What a driver reads of a controller straight from the GCS: its table in the key-value
store, and which nodes Ray reports dead (reads need no call to the controller)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from clients.ray_state import gcs
from controller.state.table import KV_NAMESPACE, kv_prefix
from controller.surface import gcs_retry, gcs_unavailable


class RayTable:
    """What a driver reads from the GCS: a controller's table in the key-value store,
    and which nodes Ray reports dead. Unit tests give a :class:`Controller` another
    object with these three methods (``clients.testing.fake_table.DriverTable``).

    While the GCS is away (the head restarting) every read waits for it, saying so on
    ``say`` (default stderr), up to :func:`controller.surface.gcs_bound_s`; then it
    raises :class:`~controller.errors.ClusterUnavailable`.
    """

    def __init__(self, controller_name: str, say: Callable[[str], None] | None = None) -> None:
        self._prefix = kv_prefix(controller_name)
        self._ns = KV_NAMESPACE.encode() if isinstance(KV_NAMESPACE, str) else KV_NAMESPACE
        self._say = say or (lambda m: print(f"placectl: {m}", file=sys.stderr, flush=True))

    def get(self, k: bytes) -> bytes | None:
        full = self._prefix + k
        return gcs_retry(
            lambda t: gcs().internal_kv_get(full, self._ns, timeout=t),
            "reading the reservation table",
            self._say,
            gcs_unavailable,
        )

    def keys(self, prefix: bytes) -> list[bytes]:
        full = self._prefix + prefix
        found = gcs_retry(
            lambda t: gcs().internal_kv_keys(full, self._ns, timeout=t),
            "reading the reservation table",
            self._say,
            gcs_unavailable,
        )
        return [k[len(self._prefix) :] for k in found]

    def dead_nodes(self, node_ids: list[str]) -> set[str]:
        """Those of ``node_ids`` Ray reports dead or does not know: one GCS round trip
        that asks about these nodes only, whatever the cluster's size."""
        if not node_ids:
            return set()
        from ray._raylet import NodeID

        wanted = [NodeID.from_hex(n) for n in node_ids]
        try:
            alive = gcs_retry(
                lambda t: gcs().check_alive(wanted, t),
                "asking which nodes are alive",
                self._say,
                gcs_unavailable,
            )
        except TypeError:  # a Ray whose check_alive takes addresses (2.48)
            from controller.surface import alive_by_table

            alive = alive_by_table(node_ids)
        return {n for n, up in zip(node_ids, alive, strict=True) if not up}


__all__ = ["RayTable"]
