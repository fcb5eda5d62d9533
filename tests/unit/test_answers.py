"""What a health check reads from a connection closed on it (controller.runtime.edge.answers),
against real sockets on loopback: a TLS server closes a plaintext client's connection
every time (a refusal of placectl: ``denied``); a process dying mid-call closes it once,
and then nothing listens (``refused``, not a refusal of placectl)."""

from __future__ import annotations

import socket
import threading

from controller.runtime.edge.answers import DENIED, OK, REFUSED, SILENT, answers


def _closer(times: int | None) -> tuple[str, threading.Thread]:
    """A server on loopback that accepts and closes each connection at once, ``times``
    times (None: for ever), then stops listening."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(10)

    def serve() -> None:
        n = 0
        try:
            while times is None or n < times:
                conn, _ = srv.accept()
                conn.recv(1024)  # the client's preface arrives: then the line goes dead
                n += 1
                if n == times:  # a dying process: its listening socket goes first
                    srv.close()
                conn.close()
        except OSError:
            pass
        finally:
            srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return f"127.0.0.1:{srv.getsockname()[1]}", t


def test_a_connection_closed_every_time_is_a_refusal_of_placectl():
    address, _ = _closer(None)
    why: dict[str, str] = {}
    assert answers({"n": address}, timeout=2.0, why=why) == {"n": DENIED}
    assert "Socket closed" in why["n"] or "handshake" in why["n"].lower()


def test_a_process_that_dies_mid_call_is_not_a_refusal():
    address, server = _closer(1)  # closes the first connection, then is gone
    why: dict[str, str] = {}
    got = answers({"n": address}, timeout=2.0, why=why)
    server.join(5)
    assert got == {"n": REFUSED} and why == {}


def _health_server() -> tuple[str, object]:
    """A gRPC server on loopback that answers the health check, as a raylet does."""
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    check = grpc.unary_unary_rpc_method_handler(lambda req, ctx: b"")
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("grpc.health.v1.Health", {"Check": check}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return f"127.0.0.1:{port}", server


def _first_connection_hangs(upstream: str) -> str:
    """A relay to ``upstream`` that swallows every byte of the first connection it
    accepts and never answers on it (a connection whose packets are lost), and relays
    every later one: what one connection over a lossy link looks like beside others."""
    host, port = upstream.rsplit(":", 1)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held = []

    def pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            if not held:
                held.append(conn)  # read nothing, answer nothing
                continue
            try:
                up = socket.create_connection((host, int(port)))
            except OSError:  # the server stopped: the test is over
                conn.close()
                return
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return f"127.0.0.1:{srv.getsockname()[1]}"


def test_a_node_in_doubt_answers_on_any_of_its_connections():
    upstream, server = _health_server()
    try:
        relay = _first_connection_hangs(upstream)
        assert answers({"n": relay}, timeout=0.5, ways=2) == {"n": OK}  # the other answers
        assert answers({"n": relay}, timeout=0.5, ways=2) == {"n": OK}  # the stuck one anew
    finally:
        server.stop(0)


def test_connections_that_are_all_late_are_made_anew():
    """A link that came back after a long cut: the connection kept from before waits in
    TCP's retransmission backoff, silent long after the process answers again. When
    every connection to a process is late, the next check connects anew."""
    upstream, server = _health_server()
    try:
        relay = _first_connection_hangs(upstream)
        assert answers({"n": relay}, timeout=0.5) == {"n": SILENT}  # its one connection
        assert answers({"n": relay}, timeout=0.5) == {"n": OK}  # not kept: a new one
    finally:
        server.stop(0)


def test_a_connect_that_meets_its_deadline_is_silence_not_a_refusal_of_placectl():
    """gRPC's TCP connector gives up with "tcp handshaker shutdown" on a host cut off:
    no word came back, which is silence, never a TLS refusal of placectl's credentials."""
    import grpc

    from controller.runtime.edge.answers import _verdict, denied

    class Error(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.UNAVAILABLE

        def details(self):
            return (
                "failed to connect to all addresses; last error: UNKNOWN: "
                "ipv4:192.0.2.3:6380: tcp handshaker shutdown"
            )

    assert denied(Error()) is None
    assert _verdict(Error().code(), Error().details()) == SILENT


def test_a_node_that_answers_on_no_connection_is_silent_on_every_one():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)  # accepts (the kernel does), never answers: a hung raylet
    try:
        address = f"127.0.0.1:{srv.getsockname()[1]}"
        assert answers({"n": address}, timeout=0.5, ways=3) == {"n": SILENT}
    finally:
        srv.close()


def test_a_connection_late_where_another_answered_is_replaced():
    upstream, server = _health_server()
    try:
        relay = _first_connection_hangs(upstream)
        assert answers({"n": relay}, timeout=0.5) == {"n": SILENT}
        assert answers({"n": relay}, timeout=2.0, ways=2) == {"n": OK}
        # The hung first connection was replaced: one connection answers again.
        assert answers({"n": relay}, timeout=2.0) == {"n": OK}
    finally:
        server.stop(0)


def test_callers_in_many_threads_share_connections_without_closing_each_others():
    """The controller checks from several threads at once, and a driver repairs its worker
    groups in parallel: a caller whose connection failed replaces it while another has
    a call on it, or is about to start one. Each must read its own answer: not a
    ``ValueError('Cannot invoke RPC: Channel closed!')`` (found in CI: it failed a GRPO
    job's recovery) nor a call cancelled by another's close read as ``silent``."""
    closer, _ = _closer(None)  # every connection closed: denied, each time
    upstream, server = _health_server()
    errors: list[BaseException] = []
    seen: list[dict[str, str]] = []

    def ask() -> None:
        try:
            for _ in range(40):
                seen.append(answers({"c": closer, "h": upstream}, timeout=2.0, ways=2))
        except BaseException as e:  # the test reports what escaped
            errors.append(e)

    try:
        threads = [threading.Thread(target=ask) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        server.stop(0)
    assert errors == [] and len(seen) == 240
    assert {a["c"] for a in seen} == {DENIED} and {a["h"] for a in seen} == {OK}
