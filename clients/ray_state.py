"""What a driver reads of Ray's own state that Ray's public API does not give: the GCS
client (its key-value store, node liveness) and an actor's row of the actor table. The
one place ``clients`` reaches into ``ray._private`` (the test harness aside), so a Ray
that moves them is followed here."""

from __future__ import annotations

from typing import Any

import ray


def gcs() -> Any:
    """This process's GCS client (connected by ``ray.init``)."""
    return ray._private.worker.global_worker.gcs_client


def actor_entry(actor: Any) -> dict:
    """``actor``'s row of Ray's actor table (``State``, ``Address``, ...); ``{}`` when
    Ray has none."""
    return actor_row(actor._actor_id.hex())


def actor_row(actor_id: str) -> dict:
    """The row of Ray's actor table of the actor ``actor_id`` (hex); ``{}`` when Ray has
    none."""
    return ray._private.state.state.actor_table(actor_id) or {}


__all__ = ["actor_entry", "actor_row", "gcs"]
