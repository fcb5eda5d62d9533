"""placectl's own gRPC calls speak as Ray's own clients do, and tell a refusal apart.

placectl makes two kinds of call below Ray's Python API: health checks of raylets and
workers (:mod:`controller.runtime.answers`) and the fence (:mod:`controller.runtime.ray_gcs`).
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

DENIED = "denied"
TEST_HOOKS = "PLACECTL_TEST_HOOKS"
TEST_CALL_TOKEN = "PLACECTL_TEST_CALL_TOKEN"

# What grpc says when the TLS handshake fails: the server refused who we are (or we
# refused it), which tells nothing of whether it runs. A plaintext call to a TLS server
# is "Socket closed": something listens, and closed the connection on us (a process
# that is gone refuses the connection instead; a stopped one lets it time out).
_HANDSHAKE = ("handshake", "ssl", "tls", "certificate", "socket closed")


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
    from ray._private.grpc_utils import init_grpc_channel

    return init_grpc_channel(address, options=_OPTIONS)


def denied(error) -> str | None:
    """Why the server refused placectl, or None if ``error`` (a ``grpc.RpcError``) says
    something else: that the process is gone, silent or failed."""
    import grpc

    code, details = error.code(), (error.details() or "")
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return f"{code.name}: {details}".strip()
    if code == grpc.StatusCode.UNAVAILABLE and any(w in details.lower() for w in _HANDSHAKE):
        return f"TLS handshake failed: {details}"
    return None


_FIELDS = ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
_Details = collections.namedtuple("_Details", _FIELDS)


def _with_token(address: str, token: str):
    """The test hook's channel: secured as Ray's, but carrying ``token``."""
    import grpc
    from ray._common.tls_utils import load_certs_from_env

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
