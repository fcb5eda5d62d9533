"""Does a Ray process answer? One gRPC health check against its port.

Every Ray process that serves gRPC (a node's raylet, an actor's core worker) answers the
standard health check from its own RPC threads, which neither a long task nor a Python
loop holding the GIL delays (measured on Ray 2.60: 2-5 ms while a worker sleeps or
spins). So the answer tells a process that runs from one that does not:

* ``ok``: it answered;
* ``refused``: nothing listens on its port: the process is gone;
* ``silent``: no answer in time: stopped (``SIGSTOP``, a hung kernel), cut off, or a
  machine that vanished without a word (no reset comes from a machine that is off);
* ``denied``: it answered, but refused placectl (a token or TLS credentials it does not
  accept): nothing is known of whether it runs (:mod:`controller.runtime.channels`).

The channel is secured as Ray secures its own (token, TLS): a secured cluster answers
placectl as it answers any Ray client.

Used by the controller for raylets (:mod:`controller.runtime.liveness`) and by worker
groups for their ranks (:mod:`clients.workers`). Imports ``grpc`` only when called.
"""

from __future__ import annotations

from collections.abc import Mapping

from controller.runtime.channels import DENIED, denied, open_channel

OK, REFUSED, SILENT = "ok", "refused", "silent"
_METHOD = "/grpc.health.v1.Health/Check"


def answers(
    addresses: Mapping[str, str],
    timeout: float,
    why: dict[str, str] | None = None,
    _again: bool = True,
) -> dict[str, str]:
    """Ask every ``key -> host:port`` at once; ``key -> ok | refused | silent | denied``
    within about ``timeout`` seconds, whatever their number. An empty address is
    ``refused``. For each ``denied`` one, ``why`` (if given) gets the server's reason.

    A connection closed on the call ("Socket closed") is what a TLS server does to a
    plaintext client, and also what a process dying mid-call does: such keys are asked
    once more, and ``denied`` only if it happens again."""
    import grpc

    out: dict[str, str] = {}
    closed: dict[str, str] = {}
    pending = []
    for key, address in addresses.items():
        if not address:
            out[key] = REFUSED
            continue
        channel = open_channel(address)
        call = channel.unary_unary(
            _METHOD, request_serializer=lambda x: x, response_deserializer=lambda x: x
        )
        pending.append((key, channel, call.future(b"", timeout=timeout)))
    for key, channel, future in pending:
        try:
            future.result()
            out[key] = OK
        except grpc.RpcError as e:
            refusal = denied(e)
            if refusal is not None and _again and _closed(e):
                closed[key] = addresses[key]
                continue
            if refusal is not None and why is not None:
                why[key] = refusal
            out[key] = DENIED if refusal is not None else _verdict(e.code(), e.details() or "")
        finally:
            channel.close()
    if closed:
        out.update(answers(closed, timeout, why, _again=False))
    return out


def _closed(error) -> bool:
    return "socket closed" in (error.details() or "").lower()


def _verdict(code, details: str) -> str:
    import grpc

    if code == grpc.StatusCode.UNAVAILABLE and "refused" in details.lower():
        return REFUSED
    return SILENT
