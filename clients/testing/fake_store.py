"""The fake cluster's GCS key-value store (:class:`clients.testing.fake_cluster.FakeCluster`
holds it), where the controller keeps its table, with the faults a real one has: writes
that fail, hang, or are held open (a slow write)."""

from __future__ import annotations

import asyncio

from clients.testing.fake_placement import FakeFault


class FakeStore:
    """The key-value store. Mixed into the fake cluster, which has ``_cost()`` and
    ``latency``.

    Attributes:
        kv: key -> value.
        bytes_written: bytes the table's writes carried (not the event history's).
        fail_kv_writes: the next n writes of the table raise.
        hang_kv_writes: writes of the table never return.
        write_gate: ``async (key) -> None``: holds a write open (a slow write).
    """

    def __init__(self) -> None:
        self.kv: dict[bytes, bytes] = {}
        self.bytes_written = 0
        self.fail_kv_writes = 0
        self.hang_kv_writes = False
        self.write_gate = None

    async def kv_get(self, key: bytes) -> bytes | None:
        self._cost("kv_get", self.latency.gcs_rtt)
        return self.kv.get(key)

    async def kv_multi_get(self, keys: list[bytes]) -> dict[bytes, bytes]:
        self._cost("kv_multi_get", self.latency.gcs_rtt)
        return {k: self.kv[k] for k in keys if k in self.kv}

    async def _write(self, key: bytes = b"") -> None:
        if self.write_gate is not None:
            await self.write_gate(key)
        if self.hang_kv_writes:
            await asyncio.Event().wait()
        if self.fail_kv_writes:
            self.fail_kv_writes -= 1
            raise FakeFault("injected: GCS write failed")

    # The event history's writes (keys event/...) are counted apart and get none of the
    # injected faults, which are aimed at the table's writes; a failing history write
    # is tested on the History itself.
    async def kv_put(self, key: bytes, value: bytes) -> None:
        history = key.startswith(b"event/")
        self._cost("kv_put_event" if history else "kv_put", self.latency.gcs_rtt)
        if not history:
            await self._write(key)
            self.bytes_written += len(key) + len(value)
        self.kv[key] = bytes(value)

    async def kv_delete(self, key: bytes) -> None:
        history = key.startswith(b"event/")
        self._cost("kv_delete_event" if history else "kv_delete", self.latency.gcs_rtt)
        if not history:
            await self._write(key)
        self.kv.pop(key, None)

    async def kv_keys(self, prefix: bytes) -> list[bytes]:
        self._cost("kv_keys", self.latency.gcs_rtt)
        return [k for k in self.kv if k.startswith(prefix)]
