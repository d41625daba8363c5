"""Processes that serve one inherited listening socket (a preloading gunicorn master and its
workers) are all woken for each connection, and only one gets it: the others' accept() must come
back at once, or their serving thread waits for the next connection, and close() (at exit: the
master's SIGTERM) with it."""
from __future__ import annotations

import socket
import threading
import time
from wsgiref.simple_server import make_server

from memprof_otel.http.server import _QuietHandler, _ThreadingWSGIServer


def _app(environ, start_response):  # noqa: ANN001 - a WSGI app
    start_response("200 OK", [("Content-Length", "2")])
    return [b"ok"]


def test_an_accept_that_another_process_won_returns_at_once_and_close_does_not_wait() -> None:
    httpd = make_server("127.0.0.1", 0, _app, server_class=_ThreadingWSGIServer, handler_class=_QuietHandler)
    try:
        # GIVEN the state a lost race leaves: the selector said "readable", the connection is gone
        # WHEN the server goes on as serve_forever does then
        done = threading.Event()
        t = threading.Thread(target=lambda: (httpd._handle_request_noblock(), done.set()), daemon=True)
        t.start()
        # THEN it is back at once, ready to be shut down (a blocking accept() waited here for good)
        assert done.wait(2.0), "accept() waited for a connection another process had taken"
        # AND a connection that does come is still answered, read and written blocking
        serving = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        serving.start()
        with socket.create_connection(httpd.server_address, timeout=5) as c:
            c.sendall(b"GET / HTTP/1.0\r\n\r\n")
            reply = b""
            while chunk := c.recv(4096):
                reply += chunk
        assert reply.startswith(b"HTTP/1.0 200") and reply.endswith(b"ok"), reply
        t0 = time.monotonic()
        httpd.shutdown()
        assert time.monotonic() - t0 < 1.0
    finally:
        httpd.server_close()
