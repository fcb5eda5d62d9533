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


# One channel per address and lane, kept while it works: a health check on a connection
# already made is one request and one answer, which a lossy link retransmits within the
# check's timeout, where a new connection's handshake, lost, is retried only after a
# second (measured on hosts with 30% of packets lost both ways: a node fenced within 20 s
# with a new connection per check). A channel that failed otherwise than by a late answer
# is closed, and the next check connects anew.
#
# A node in doubt is asked over several lanes at once (``ways``): TCP delivers a
# connection's bytes in order, so one lost packet holds every later check on that
# connection behind its retransmission, and looks on one connection miss together. Lanes
# are connections of their own, whose losses are independent: a lossy link rarely
# silences them all, and a cut one silences every one (scripts/bench/bench_looks.py).
# A lane late where another answered is stuck behind a lost packet, whose retransmission
# waits longer at each loss (measured: one connection silent for 29 s on a link losing
# 30%): it is replaced by a new connection, made at once, before the next check.
DOUBT_WAYS = 3  # connections for a process in doubt (the controller: settings.looks)
_KEPT: collections.OrderedDict[tuple[str, int], object] = collections.OrderedDict()
_KEPT_MOST = 4096
_LOCK = threading.Lock()
_BEST = (OK, DENIED, REFUSED, SILENT)  # of a node's lanes, the answer that counts


def _channel(address: str, lane: int, fresh: bool):
    with _LOCK:
        key = (address, lane)
        channel = None if fresh else _KEPT.pop(key, None)
        if fresh:
            _drop(address, lane)
        if channel is None:
            channel = open_channel(address)
        _KEPT[key] = channel  # the most recently used last
        while len(_KEPT) > _KEPT_MOST:
            _KEPT.popitem(last=False)[1].close()
        return channel


def _drop(address: str, lane: int) -> None:
    old = _KEPT.pop((address, lane), None)
    if old is not None:
        old.close()


def answers(
    addresses: Mapping[str, str],
    timeout: float,
    why: dict[str, str] | None = None,
    ways: Mapping[str, int] | int = 1,
    _again: bool = True,
) -> dict[str, str]:
    """Ask every ``key -> host:port`` at once; ``key -> ok | refused | silent | denied``
    within about ``timeout`` seconds, whatever their number. An empty address is
    ``refused``. For each ``denied`` one, ``why`` (if given) gets the server's reason.

    ``ways`` (for all keys, or per key) asks over that many connections at once; the
    best answer counts (``ok`` over ``denied`` over ``refused`` over ``silent``).

    A connection closed on the call ("Socket closed") is what a TLS server does to a
    plaintext client, and also what a process dying mid-call does: such keys are asked
    once more, on a new connection, and ``denied`` only if it happens again."""
    import grpc

    got: dict[str, list[str]] = {}
    refusals: dict[str, str] = {}
    closed: dict[str, str] = {}
    late: list[tuple[str, str, int]] = []
    pending = []
    for key, address in addresses.items():
        if not address:
            got[key] = [REFUSED]
            continue
        n = ways if isinstance(ways, int) else ways.get(key, 1)
        for lane in range(max(1, n) if _again else 1):
            call = _channel(address, lane, fresh=not _again).unary_unary(
                _METHOD, request_serializer=lambda x: x, response_deserializer=lambda x: x
            )
            pending.append((key, address, lane, call.future(b"", timeout=timeout)))
    for key, address, lane, future in pending:
        try:
            future.result()
            got.setdefault(key, []).append(OK)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                late.append((key, address, lane))
            else:
                with _LOCK:  # broken, not late: the next check connects anew
                    _drop(address, lane)
            refusal = denied(e)
            if refusal is not None and _again and _closed(e):
                closed[key] = address
                continue
            if refusal is not None:
                refusals[key] = refusal
            answer = DENIED if refusal is not None else _verdict(e.code(), e.details() or "")
            got.setdefault(key, []).append(answer)
    out = {key: min(lanes, key=_BEST.index) for key, lanes in got.items()}
    for key, address, lane in late:
        if out.get(key) == OK:  # stuck where another lane answered: replaced now
            grpc.channel_ready_future(_channel(address, lane, fresh=True))
    closed = {k: a for k, a in closed.items() if out.get(k) != OK}
    if closed:
        out.update(answers(closed, timeout, why, _again=False))
    if why is not None:
        why.update({k: r for k, r in refusals.items() if out.get(k) == DENIED})
    return out


def _closed(error) -> bool:
    return "socket closed" in (error.details() or "").lower()


def _verdict(code, details: str) -> str:
    import grpc

    if code == grpc.StatusCode.UNAVAILABLE and "refused" in details.lower():
        return REFUSED
    return SILENT
