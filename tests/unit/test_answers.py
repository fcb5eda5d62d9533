"""What a health check reads from a connection closed on it (controller.runtime.answers),
against real sockets on loopback: a TLS server closes a plaintext client's connection
every time (a refusal of placectl: ``denied``); a process dying mid-call closes it once,
and then nothing listens (``refused``, not a refusal of placectl)."""

from __future__ import annotations

import socket
import threading

from controller.runtime.answers import DENIED, REFUSED, answers


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
