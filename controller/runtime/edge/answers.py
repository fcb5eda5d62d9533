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
  accept): nothing is known of whether it runs (see below).

The channel is secured as Ray secures its own (token, TLS): a secured cluster answers
placectl as it answers any Ray client.

Used by the controller for raylets (:mod:`controller.runtime.steps.liveness`) and by worker
groups for their ranks (:mod:`clients.workers`). Imports ``grpc`` only when called.

**Channels.** placectl's own gRPC calls speak as Ray's own clients do, and tell a
refusal apart. placectl makes two kinds of call below Ray's Python API: health checks
of raylets and workers (here) and the fence (:mod:`controller.runtime.edge.ray_gcs`).
Both open their channel with Ray's own helper, ``ray._private.grpc_utils.init_grpc_channel``,
the one Ray's dashboard, state API and autoscaler SDK open theirs with. It reads the
cluster's security settings the way every Ray process does, so placectl needs none of
its own:

* token authentication (``RAY_AUTH_MODE=token``): each call carries the cluster's token,
  which Ray's ``AuthenticationTokenLoader`` finds in ``RAY_AUTH_TOKEN``,
  ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``;
* TLS (``RAY_USE_TLS=1``): a secure channel with ``RAY_TLS_SERVER_CERT``,
  ``RAY_TLS_SERVER_KEY`` and ``RAY_TLS_CA_CERT``.

A private helper, but the one Ray keeps in step with its servers: reading the variables
by hand would miss the next way Ray learns to find its token.

An answer that refuses *placectl* (unauthenticated, permission denied, a TLS handshake
that fails) says nothing about whether the process lives: it is :data:`DENIED`, never
"dead" and never "silent" (:func:`denied`). Callers then leave the verdict to Ray.

Test hook: where ``PLACECTL_TEST_HOOKS=1`` (placectl's test clusters,
:mod:`clients.testing`), ``PLACECTL_TEST_CALL_TOKEN`` replaces the token on placectl's
own calls alone, so a test can have the cluster refuse placectl and nothing else.
Imports ``grpc`` and Ray only when called.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Mapping

DENIED = "denied"
TEST_HOOKS = "PLACECTL_TEST_HOOKS"
TEST_CALL_TOKEN = "PLACECTL_TEST_CALL_TOKEN"

# What grpc says when the TLS handshake fails: the server refused who we are (or we
# refused it), which tells nothing of whether it runs. A plaintext call to a TLS server
# is "Socket closed": something listens, and closed the connection on us (a process
# that is gone refuses the connection instead; a stopped one lets it time out).
_HANDSHAKE = ("handshake", "ssl", "tls", "certificate", "socket closed")
# ...but gRPC's own TCP connector gives up with "tcp handshaker shutdown" when a connect
# meets its deadline unanswered (a host cut off): silence, not a refusal of who we are.
_NOT_TLS = ("tcp handshaker",)


class CallDenied(RuntimeError):
    """A call of placectl's own was refused for who placectl is (its token or TLS
    credentials): nothing was done, and trying again changes nothing."""


def test_hooks() -> bool:
    """Whether this process belongs to a cluster started for tests."""
    return os.environ.get(TEST_HOOKS, "") == "1"


# Each channel its own connection: gRPC shares one per address among a process's
# channels by default, and one that just failed answers every new call at once with its
# old error until its reconnect backoff (up to minutes) runs out, so a host back from a
# cut would read silent, and a second look at a closed connection would see the first.
_OPTIONS = [("grpc.use_local_subchannel_pool", 1)]


def open_channel(address: str):
    """A synchronous gRPC channel to ``host:port``, secured as Ray secures its own, with
    a connection of its own."""
    token = os.environ.get(TEST_CALL_TOKEN) if test_hooks() else None
    if token:
        return _with_token(address, token)
    try:
        from ray._private.grpc_utils import init_grpc_channel
    except ImportError:  # before Ray 2.52 (no token authentication): TLS alone, from here
        from ray._private.utils import init_grpc_channel

    return init_grpc_channel(address, options=_OPTIONS)


def denied(error) -> str | None:
    """Why the server refused placectl, or None if ``error`` (a ``grpc.RpcError``) says
    something else: that the process is gone, silent or failed."""
    import grpc

    code, details = error.code(), (error.details() or "")
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return f"{code.name}: {details}".strip()
    said = details.lower()
    if any(w in said for w in _NOT_TLS):
        return None
    if code == grpc.StatusCode.UNAVAILABLE and any(w in said for w in _HANDSHAKE):
        return f"TLS handshake failed: {details}"
    return None


_FIELDS = ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
_Details = collections.namedtuple("_Details", _FIELDS)


def _with_token(address: str, token: str):
    """The test hook's channel: secured as Ray's, but carrying ``token``."""
    import grpc

    try:
        from ray._common.tls_utils import load_certs_from_env
    except ImportError:  # before Ray 2.55
        from ray._private.tls_utils import load_certs_from_env

    class _Bearer(grpc.UnaryUnaryClientInterceptor):
        def intercept_unary_unary(self, continuation, details, request):
            fields = {f: getattr(details, f, None) for f in _FIELDS}
            fields["metadata"] = [*(details.metadata or []), ("authorization", f"Bearer {token}")]
            return continuation(_Details(**fields), request)

    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        cert, key, ca = load_certs_from_env()
        creds = grpc.ssl_channel_credentials(
            certificate_chain=cert, private_key=key, root_certificates=ca
        )
        channel = grpc.secure_channel(address, creds, options=_OPTIONS)
    else:
        channel = grpc.insecure_channel(address, options=_OPTIONS)
    return grpc.intercept_channel(channel, _Bearer())


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
# 30%): it is replaced by a new connection, made at once, before the next check. When
# every lane of a process is late, each is dropped, and the next check connects anew:
# after a cut heals, a kept connection would stay silent until its next retransmission.
DOUBT_WAYS = 3  # connections for a process in doubt (the controller: settings.looks)
_KEPT_MOST = 4096
_LOCK = threading.Lock()
_BEST = (OK, DENIED, REFUSED, SILENT)  # of a node's lanes, the answer that counts


class _Kept:
    """A channel and the calls on it. Callers in several threads share channels (the
    controller's checks, a driver repairing its groups in parallel): one that retires a
    channel (broken, replaced, too many kept) must not close it under another's call,
    which would fail at once with ``ValueError('Cannot invoke RPC: Channel closed!')``
    or, already started, be cancelled and read ``silent``. A retired channel closes when
    its last call is done."""

    __slots__ = ("calls", "channel", "retired")

    def __init__(self, channel) -> None:
        self.channel, self.calls, self.retired = channel, 0, False

    def retire(self) -> None:  # under _LOCK
        self.retired = True
        if self.calls == 0:
            self.channel.close()


_KEPT: collections.OrderedDict[tuple[str, int], _Kept] = collections.OrderedDict()


def _borrow(address: str, lane: int, fresh: bool) -> _Kept:
    """The kept channel of ``(address, lane)`` (a new one if ``fresh``), with one more
    call on it: give it back with :func:`_give_back`."""
    with _LOCK:
        key = (address, lane)
        kept = _KEPT.pop(key, None)
        if kept is not None and fresh:
            kept.retire()
            kept = None
        if kept is None:
            kept = _Kept(open_channel(address))
        _KEPT[key] = kept  # the most recently used last
        while len(_KEPT) > _KEPT_MOST:
            _KEPT.popitem(last=False)[1].retire()
        kept.calls += 1
        return kept


def _give_back(address: str, lane: int, kept: _Kept, broken: bool) -> None:
    """A call on ``kept`` is done; if it ``broken`` the channel, the next call on
    ``(address, lane)`` connects anew (unless another caller already replaced it)."""
    with _LOCK:
        kept.calls -= 1
        if broken and _KEPT.get((address, lane)) is kept:
            del _KEPT[(address, lane)]
            kept.retired = True
        if kept.retired and kept.calls == 0:
            kept.channel.close()


def _retire(address: str, lane: int) -> None:
    """The kept channel of ``(address, lane)`` is dropped: the next call connects anew."""
    with _LOCK:
        kept = _KEPT.pop((address, lane), None)
        if kept is not None:
            kept.retire()


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
            kept = _borrow(address, lane, fresh=not _again)
            call = kept.channel.unary_unary(
                _METHOD, request_serializer=lambda x: x, response_deserializer=lambda x: x
            )
            pending.append((key, address, lane, kept, call.future(b"", timeout=timeout)))
    for key, address, lane, kept, future in pending:
        try:
            future.result()
            _give_back(address, lane, kept, broken=False)
            got.setdefault(key, []).append(OK)
        except grpc.RpcError as e:
            late_only = e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            if late_only:
                late.append((key, address, lane))
            # broken, not late: the next check connects anew
            _give_back(address, lane, kept, broken=not late_only)
            refusal = denied(e)
            if refusal is not None and _again and _closed(e):
                closed[key] = address
                continue
            if refusal is not None:
                refusals[key] = refusal
            answer = DENIED if refusal is not None else _verdict(e.code(), e.details() or "")
            got.setdefault(key, []).append(answer)
    out = {key: min(lanes, key=_BEST.index) for key, lanes in got.items()}
    lanes_late = collections.Counter(key for key, _, _ in late)
    for key, address, lane in late:
        if out.get(key) == OK:  # stuck where another lane answered: replaced now
            fresh = _borrow(address, lane, fresh=True)
            grpc.channel_ready_future(fresh.channel)  # connects now, before the next check
            _give_back(address, lane, fresh, broken=False)
        elif lanes_late[key] == len(got.get(key, ())):
            # Every lane late: each connection may be stuck in TCP's retransmission
            # backoff (after a cut of 30 s, the next retry comes tens of seconds later,
            # long after the link is back). The next check connects anew on each.
            _retire(address, lane)
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
