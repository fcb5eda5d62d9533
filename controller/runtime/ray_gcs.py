"""Ray's GCS, where placectl reaches it below Ray's Python API: telling it a node is
dead (a fence), where it keeps its tables, and what its unavailability looks like. Part
of the Ray edge, with :mod:`controller.runtime.ray_io`."""

from __future__ import annotations

import ray


def gcs_store(env) -> str:
    """Where the GCS keeps its tables, from the environment of a process the head
    started (the controller runs on the head): Ray's GCS reads the same variables.
    ``RAY_REDIS_ADDRESS`` (``ray start --head``, KubeRay's GCS fault tolerance) means
    Redis; ``RAY_gcs_storage=rocksdb`` the embedded store (alpha in Ray 2.60)."""
    if env.get("RAY_REDIS_ADDRESS") or env.get("RAY_gcs_storage", "").lower() == "redis":
        return "redis"
    if env.get("RAY_gcs_storage", "").lower() == "rocksdb":
        return "rocksdb"
    return "memory"


def gcs_unavailable(e: BaseException) -> bool:
    """Whether ``e`` is Ray saying that the GCS does not answer (not that it refused):
    ``RpcError("Timed out while waiting for GCS to become available")`` on Ray 2.60."""
    return isinstance(e, ray.exceptions.RpcError)


# The GCS's own reason for a node lost without notice (ray.rpc.NodeDeathInfo.Reason).
_UNEXPECTED_TERMINATION = 2


def fence_node(gcs_address: str, node_id: str, why: str, timeout: float = 10.0) -> None:
    """Tell the GCS that ``node_id`` is dead now, as its raylet would on leaving.

    Ray then does what it does after its own health checks give up: the node's actors
    are dead, its placement-group bundles are rescheduled, and every subscriber hears
    the node died. A raylet of a fenced node that comes back (``SIGCONT``, a healed
    partition) is told it is dead and exits, and its workers exit with it; it never
    gets its node id back. Idempotent: a node already dead is left as it is.

    The call is secured as Ray secures its own (:mod:`controller.runtime.channels`).

    Raises:
        CallDenied: the GCS refused placectl (token, TLS): nothing was fenced.
        grpc.RpcError: the call failed otherwise (the GCS away, the deadline passed).
    """
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    from controller.runtime.channels import CallDenied, denied, open_channel

    request = gcs_service_pb2.UnregisterNodeRequest(node_id=bytes.fromhex(node_id))
    request.node_death_info.reason = _UNEXPECTED_TERMINATION
    request.node_death_info.reason_message = why
    with open_channel(gcs_address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.UnregisterNode(request, timeout=timeout)
        except grpc.RpcError as e:
            refusal = denied(e)
            if refusal is not None:
                raise CallDenied(refusal) from None
            raise
