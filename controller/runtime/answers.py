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

import collections
import threading
from collections.abc import Mapping

from controller.runtime.channels import DENIED, denied, open_channel

OK, REFUSED, SILENT = "ok", "refused", "silent"
_METHOD = "/grpc.health.v1.Health/Check"


# One channel per address, kept while it works: a health check on a connection already
# made is one request and one answer, which a lossy link retransmits within the check's
# timeout, where a new connection's handshake, lost, is retried only after a second
# (measured on hosts with 30% of packets lost both ways: a node fenced within 20 s with a
# new connection per check). A channel that failed otherwise than by a late answer is
# closed, and the next check connects anew.
_KEPT: collections.OrderedDict[str, object] = collections.OrderedDict()
_KEPT_MOST = 4096
_LOCK = threading.Lock()


def _channel(address: str, fresh: bool):
    with _LOCK:
        channel = None if fresh else _KEPT.pop(address, None)
        if fresh:
            _drop(address)
        if channel is None:
            channel = open_channel(address)
        _KEPT[address] = channel  # the most recently used last
        while len(_KEPT) > _KEPT_MOST:
            _KEPT.popitem(last=False)[1].close()
        return channel


def _drop(address: str) -> None:
    old = _KEPT.pop(address, None)
    if old is not None:
        old.close()


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
    once more, on a new connection, and ``denied`` only if it happens again."""
    import grpc

    out: dict[str, str] = {}
    closed: dict[str, str] = {}
    pending = []
    for key, address in addresses.items():
        if not address:
            out[key] = REFUSED
            continue
        channel = _channel(address, fresh=not _again)
        call = channel.unary_unary(
            _METHOD, request_serializer=lambda x: x, response_deserializer=lambda x: x
        )
        pending.append((key, address, call.future(b"", timeout=timeout)))
    for key, address, future in pending:
        try:
            future.result()
            out[key] = OK
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                with _LOCK:  # broken, not late: the next check connects anew
                    _drop(address)
            refusal = denied(e)
            if refusal is not None and _again and _closed(e):
                closed[key] = address
                continue
            if refusal is not None and why is not None:
                why[key] = refusal
            out[key] = DENIED if refusal is not None else _verdict(e.code(), e.details() or "")
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
