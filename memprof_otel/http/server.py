"""Transports for the endpoint: a small threaded server (``serve``) and WSGI / ASGI apps.

Bodies larger than the cap are refused from ``Content-Length`` before a byte is read. WSGI has no
body without a length (wsgiref does not do chunked requests), so none is read then; the ASGI app
reads a length-less body up to the cap plus one byte. The server binds 127.0.0.1 by default.

Whatever arrives, the answer is the JSON error shape: requests the standard library refuses before
our routes run (a garbage request line, a bad header line, HTTP/0.9, over-long lines) are answered
by ``_QuietHandler.send_error``, and a failure inside wsgiref by ``_JsonServerHandler``.

A connection that fails (the client times out, resets, goes away before the answer; our own code
raises) is counted and logged at a bounded rate by ``connection_errors``, never printed as a traceback.
"""
from __future__ import annotations

import asyncio
import contextlib
import email.errors
import errno
import logging
import os
import socket
import sys
import threading
from http import HTTPStatus
from socketserver import ThreadingMixIn
from typing import Any, Callable, Iterable
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer, make_server

from ..errors import ConfigError, ServeError
from ..telemetry.ranks import ranks_from
from .app import Endpoint, EndpointServices, Request, Response, dumps, error_response
from .connection_errors import connection_failed
from .workers import parent_is_server, rank_port, warn_if_round_robin

log = logging.getLogger("memprof_otel")

SOCKET_TIMEOUT_S = 60.0  # a client that stops sending mid-request frees its thread after this
# environ key: the socket error that cut a request body short. The request is still answered (400);
# our server counts the failure once the answer is out, a host server of a mounted app ignores it.
BODY_ERROR_KEY = "memprof_otel.body_error"


def _status_line(code: int) -> str:
    """``"202 Accepted"``: the standard reason phrase for every status the endpoint may send."""
    try:
        return f"{code} {HTTPStatus(code).phrase}"
    except ValueError:  # not a registered status: the code alone is valid HTTP
        return f"{code} "


def _too_large(limit: int) -> Response:
    return error_response(413, "body_too_large", f"request body over {limit} bytes")


class BodyIncomplete(Exception):
    """The client ended its side of the connection before sending all of its Content-Length."""


def _body_incomplete() -> Response:
    return error_response(400, "body_incomplete", "the request body did not arrive in full")


def _read_body(read: Callable[[int], bytes], length: str | None, limit: int) -> bytes | None:
    """The body, or None when its Content-Length is over ``limit`` (nothing is read then).
    ``BodyIncomplete`` when fewer bytes arrive than announced (the client half-closed)."""
    if length:
        try:
            n = int(length)
        except ValueError:
            n = -1
        if n < 0 or n > limit:
            return None
        body = read(n) if n else b""
        if len(body) != n:  # a buffered read returns less only at end of stream
            raise BodyIncomplete(f"{len(body)} of {n} bytes")
        return body
    return b""


def _utf8_path(path: str) -> str | None:
    """PATH_INFO as the client wrote it: WSGI servers decode the path's %-escapes as latin-1 (PEP
    3333); the URL's bytes are UTF-8. None when they are not."""
    try:
        return path.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return None


def _wsgi_response(endpoint: Endpoint, environ: dict[str, Any]) -> Response:
    try:
        body = _read_body(environ["wsgi.input"].read, environ.get("CONTENT_LENGTH"), endpoint.max_body_bytes)
    except OSError as e:  # the client stopped sending (socket timeout) or went away
        environ[BODY_ERROR_KEY] = e
        return _body_incomplete()
    except BodyIncomplete:  # the client half-closed early: answered, nothing runs on a partial body
        return _body_incomplete()
    if body is None:
        return _too_large(endpoint.max_body_bytes)
    path = _utf8_path(environ.get("PATH_INFO", "/"))
    if path is None:
        return error_response(400, "bad_path", "the request path is not UTF-8 once its %-escapes are decoded")
    headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items() if k.startswith("HTTP_")}
    if environ.get("CONTENT_TYPE"):
        headers["content-type"] = environ["CONTENT_TYPE"]
    return endpoint.handle(Request(environ.get("REQUEST_METHOD", "GET"), path,
                                   environ.get("QUERY_STRING", ""), headers, body, environ.get("REMOTE_ADDR", "")))


def wsgi_app(rt: EndpointServices, token: str | None = None, *, bind_host: str | None = None,
             mounted: bool = True) -> Callable[..., Iterable[bytes]]:
    """The endpoint as a WSGI application (mount it in gunicorn, Flask, Django...). ``mounted``:
    in the application's server, whose workers share its port (``Server`` passes False)."""
    endpoint = Endpoint(rt, token=token, bind_host=bind_host)
    check = _WorkerCheck(rt) if mounted else None

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if check is not None:
            check()
        resp = _wsgi_response(endpoint, environ)
        start_response(_status_line(resp.status), [("Content-Type", resp.content_type),
                                                   ("Content-Length", str(len(resp.body))),
                                                   *resp.headers.items()])
        return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else resp.body]

    app.endpoint = endpoint  # type: ignore[attr-defined]
    return app


def asgi_app(rt: EndpointServices, token: str | None = None, *,
             bind_host: str | None = None) -> Callable[..., Any]:
    """The endpoint as an ASGI application (mount it in FastAPI/Starlette: ``app.mount("/memprof", ...)``).
    Handlers run in a worker thread: a dump waiting for forwards never blocks the event loop."""
    endpoint = Endpoint(rt, token=token, bind_host=bind_host)
    check = _WorkerCheck(rt)

    async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        limit = endpoint.max_body_bytes
        resp: Response | None = None
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            resp = _too_large(limit)
        body = bytearray()
        if resp is None:
            more = True
            while more:
                msg = await receive()
                if msg.get("type") == "http.disconnect":  # gone before its body was in: nothing to run
                    return
                body += msg.get("body", b"")
                more = msg.get("more_body", False)
                if len(body) > limit:
                    resp = _too_large(limit)
                    break
        if resp is None and length is not None and len(body) != int(length):
            resp = _body_incomplete()
        if resp is None:
            client = (scope.get("client") or ("", 0))[0]
            path = scope.get("path", "/")
            root = scope.get("root_path", "")
            if root and path.startswith(root):  # mounted under a prefix
                path = path[len(root):] or "/"
            req = Request(scope.get("method", "GET"), path, scope.get("query_string", b"").decode("latin-1"),
                          headers, bytes(body), client)
            resp = await asyncio.to_thread(check.then, endpoint.handle, req)
        await send({"type": "http.response.start", "status": resp.status,
                    "headers": [(b"content-type", resp.content_type.encode()),
                                (b"content-length", str(len(resp.body)).encode()),
                                *((k.lower().encode(), v.encode()) for k, v in resp.headers.items())]})
        await send({"type": "http.response.body", "body": b"" if scope.get("method") == "HEAD" else resp.body})

    app.endpoint = endpoint  # type: ignore[attr-defined]
    return app


class _WorkerCheck:
    """Once per mounted app, at its first request (the server's workers exist by then; at mount
    time, in a preloading server, they do not): warn when the app runs in several worker processes
    that each answer a share of the scrapes with only their own series."""

    def __init__(self, rt: EndpointServices) -> None:
        self._rt = rt
        self._done = False

    def __call__(self) -> None:
        if self._done:
            return
        self._done = True
        cfg = self._rt.config
        try:
            warn_if_round_robin(cfg is not None and cfg.workers.snapshot_dir is not None)
        except Exception:  # a hint only: never the reason a scrape fails
            pass

    def then(self, fn: Callable[[Request], Response], req: Request) -> Response:
        self()
        return fn(req)


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True
    reuse_port = False  # True: every worker binds the one port (single-port mode, workers.snapshot_dir)
    # the listen backlog (the kernel caps it at net.core.somaxconn). The standard library's 5 fills
    # up in any burst of connections (a crowd of idle clients, many scrapers at once); the kernel
    # then drops new connection attempts, and each costs its client, a scrape too, a 1 s retransmit.
    request_queue_size = 128
    count_connection_error: Callable[[str], None]  # by reason; ``Server`` sets it before serving

    def server_bind(self) -> None:
        if self.reuse_port and hasattr(socket, "SO_REUSEPORT"):
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()
        # accept() must not wait: where processes serve one inherited socket (a preloading
        # gunicorn master and its workers), each is woken for a connection only one of them gets,
        # and a blocking accept() then held the others' serving thread until the next connection,
        # and with it close(): a SIGTERM'd master hung at exit for as long (10 s and more, seen).
        # A non-blocking one raises BlockingIOError, which serve_forever takes as "no request".
        self.socket.setblocking(False)

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, addr = self.socket.accept()
        conn.setblocking(True)  # the connection itself is read and written blocking, as before
        return conn, addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Whatever escaped a connection's handler: counted and logged rate-limited (the standard
        library prints a traceback per connection, an idle or a vanished client included)."""
        exc = sys.exc_info()[1]
        if exc is not None:
            connection_failed(self.count_connection_error, exc, client_address)


class _V6Server(_ThreadingWSGIServer):
    address_family = socket.AF_INET6


class _SharedServer(_ThreadingWSGIServer):
    reuse_port = True


class _SharedV6Server(_V6Server):
    reuse_port = True


def _server_class(host: str, shared: bool) -> type[_ThreadingWSGIServer]:
    if ":" in host:
        return _SharedV6Server if shared else _V6Server
    return _SharedServer if shared else _ThreadingWSGIServer


# a header line without a colon, a continuation line first (others, e.g. a multipart content type
# without its body, are about the body, which the email parser never saw)
_HEADER_DEFECTS = (email.errors.MissingHeaderBodySeparatorDefect, email.errors.FirstHeaderLineIsContinuationDefect,
                   email.errors.InvalidHeaderDefect)


class _JsonServerHandler(ServerHandler):
    """wsgiref's per-request handler, with its last-resort 500 in our JSON shape; every failure
    goes up to the server's ``handle_error``, to be counted once."""
    error_headers = [("Content-Type", "application/json")]
    error_body = dumps({"error": "internal", "detail": "the server failed while answering"})

    def run(self, application: Callable[..., Iterable[bytes]]) -> None:
        """``ServerHandler.run``, but every failure goes up to the server's ``handle_error`` (wsgiref
        drops a reset or a broken pipe unseen and prints a traceback for any other failure, a
        timed-out write included). Our own failure is first answered with the JSON 500 where
        nothing was sent yet."""
        try:
            self.setup_environ()
            environ = self.environ
            self.result = application(environ, self.start_response)
            self.finish_response()
        except Exception as e:
            if not isinstance(e, OSError):  # our failure, not the socket's: the client may still listen
                self._answer_500()
            raise
        body_error = environ.get(BODY_ERROR_KEY)
        if body_error is not None:  # answered (400), but the client failed to send its body all the same
            raise body_error

    def _answer_500(self) -> None:
        if self.headers_sent:
            return
        with contextlib.suppress(OSError):  # the client left meanwhile: our failure is the one counted
            self.result = self.error_output(self.environ, self.start_response)
            self.finish_response()


class _QuietHandler(WSGIRequestHandler):
    """wsgiref's request handler, strict about the request and answering JSON to whatever it refuses."""
    timeout = SOCKET_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass  # access logs are the application's business, not ours

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The JSON error shape instead of the standard library's HTML page."""
        if self.request_version in ("", "HTTP/0.9") or not self.request_version.startswith("HTTP/1."):
            self.request_version = "HTTP/1.0"  # else no status line nor headers would be written
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "Error"
        error = phrase.lower().replace(" ", "_").replace("-", "_") or "error"
        body = dumps({"error": error, "detail": (message or phrase)[:300]})
        self.close_connection = True
        self.send_response(code, phrase)
        self.send_header("Connection", "close")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def parse_request(self) -> bool:
        words = self.raw_requestline.split()
        if len(words) == 2:  # "GET /path": HTTP/0.9, after which no header block comes, while the
            # stdlib would read one first and so wait for the client's timeout before answering
            self.command, self.path = (w.decode("latin-1") for w in words)
            self.requestline = self.raw_requestline.decode("latin-1").rstrip("\r\n")
            self.request_version, self.close_connection = "HTTP/0.9", True
            self.send_error(505, "HTTP/0.9 is not supported; use HTTP/1.0 or HTTP/1.1")
            return False
        if not super().parse_request():
            if not self.raw_requestline.strip():  # an empty line: the stdlib closes without answering
                self.send_error(400, "empty request line")
            return False
        if any(isinstance(d, _HEADER_DEFECTS) for d in self.headers.defects):
            self.send_error(400, "malformed header line")
            return False
        return True

    def handle(self) -> None:
        """One request, as ``WSGIRequestHandler.handle`` with a JSON last-resort error handler. A
        socket error (timeout, reset) propagates to the server's ``handle_error``, which counts it."""
        self.raw_requestline = self.rfile.readline(65537)
        if not self.raw_requestline:  # closed before a byte came (a port probe, a TCP health check):
            return                    # nothing to answer, nothing failed
        if len(self.raw_requestline) > 65536:
            self.requestline, self.request_version, self.command = "", "", ""
            self.send_error(414, "request line over 65536 bytes")
            return
        if not self.parse_request():
            return
        handler = _JsonServerHandler(self.rfile, self.wfile, self.get_stderr(), self.get_environ(),
                                     multithread=False)
        handler.request_handler = self  # type: ignore[attr-defined] # backpointer for logging
        handler.run(self.server.get_app())


class Server:
    """A running endpoint: ``.port``, ``.url``, ``.close()`` (also a context manager).

    ``port_count`` > 1: the first free port of ``port .. port + port_count - 1`` (a port per worker
    process, without a worker index). ``shared``: bound with SO_REUSEPORT, so every worker of a
    server binds the same port and any of them answers (single-port mode)."""

    def __init__(self, rt: EndpointServices, host: str, port: int, token: str | None, *,
                 port_count: int = 1, shared: bool = False) -> None:
        rt.ensure_started()
        self._rt = rt
        self.host = host
        self.requested = (host, port, token, port_count, shared)
        app = wsgi_app(rt, token, bind_host=host, mounted=False)  # its own port: no sharing to warn about
        self._httpd = self._bind(app, host, port, port_count, shared)
        self._httpd.count_connection_error = rt.counters.count_http_connection_error
        self.port = self._httpd.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.port}"
        app.endpoint.base_url = ""  # type: ignore[attr-defined]
        self._closed = False
        self._start_thread()
        rt.servers.append(self)

    @staticmethod
    def _bind(app: Any, host: str, port: int, port_count: int, shared: bool) -> _ThreadingWSGIServer:
        ports = [port] if port == 0 or shared else list(range(port, min(65536, port + port_count)))
        for i, p in enumerate(ports):
            try:
                return make_server(host, p, app, server_class=_server_class(host, shared),  # type: ignore[return-value]
                                   handler_class=_QuietHandler)
            except OSError as e:  # port taken, address not on this host, no permission for a low port
                if e.errno == errno.EADDRINUSE and i + 1 < len(ports):
                    continue  # a sibling worker has this one: try the next
                where = f"{host}:{p}" if len(ports) == 1 else f"{host}:{ports[0]}..{ports[-1]} (all taken)"
                # errno and its text kept: a caller that reports ``e.strerror`` says why, not "None"
                raise ServeError(e.errno, f"cannot serve on {where}: {e.strerror or e}") from e
        raise ServeError(f"cannot serve on {host}:{port}: no port to try")  # unreachable: ports is never empty

    def _start_thread(self) -> None:
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name=f"memprof-http-{self.port}", daemon=True)
        self._thread.start()

    # ---- after fork: the child inherited the listening socket, not the thread that serves it
    def resume_in_child(self) -> None:
        """Serve the inherited socket from this process too: parent and children then share the
        port, the kernel hands each connection to one of them (single-port mode)."""
        if not self._closed:
            self._start_thread()

    def release_in_child(self) -> None:
        """Close this process's copy of the inherited socket (the parent's stays open and served)."""
        self._closed = True
        try:
            self._httpd.socket.close()
        except OSError:
            pass
        try:
            self._rt.servers.remove(self)
        except ValueError:
            pass

    def close(self, timeout: float = 2.0) -> None:
        if self._closed:
            return
        self._closed = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout)
        try:
            self._rt.servers.remove(self)
        except ValueError:
            pass

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<memprof_otel.Server {self.url}>"


def renew_servers_in_child(rt: EndpointServices) -> None:
    """In a child forked from a process that serves the endpoint (a pre-fork server's worker): with
    ``workers.snapshot_dir`` the child serves the inherited port too, with every worker's series;
    with ``http.port_count`` > 1 it takes the next free port of the range; else the endpoint stays
    with the parent, and a server's worker is told why it serves none."""
    cfg = rt.config
    if cfg is None:
        return
    for srv in list(rt.servers):
        if not isinstance(srv, Server):
            continue
        if cfg.workers.snapshot_dir is not None:
            srv.resume_in_child()  # any process answers on the one port, with every worker's series
            continue
        srv.release_in_child()
        host, port, token, count, shared = srv.requested
        if count > 1:  # a port per worker: this child takes the next free one of the range
            try:
                Server(rt, host, port, token, port_count=count, shared=shared)
            except ServeError as e:
                log.warning("memprof_otel: this worker (pid %d) serves no endpoint: %s", os.getpid(), e)
        else:  # a server's worker hears it; a DataLoader or pool worker need not
            log.log(logging.WARNING if parent_is_server() else logging.DEBUG,
                    "memprof_otel: the endpoint on %s was started before this worker (pid %d) was "
                    "forked; it stays with process %d and this worker serves none. Set "
                    "workers.snapshot_dir to serve every worker's series on that port, or "
                    "http.port_count to give each worker a port of its own.",
                    srv.url, os.getpid(), os.getppid())


def serve(rt: EndpointServices, host: str | None = None, port: int | None = None,
          token: str | None = None) -> Server:
    """Start the endpoint on its own threads; defaults from config ``http`` (127.0.0.1:9464).
    With ``http.port_count`` > 1 it takes the first free port from ``port`` on; with
    ``workers.snapshot_dir`` set every worker binds the same port (SO_REUSEPORT). In a rank of a
    distributed job (``RANK`` set) the configured port is ``http.port + LOCAL_RANK`` unless
    ``http.port_per_rank`` is false; a ``port`` passed here is used as given."""
    cfg = rt.ensure_started().config
    assert cfg is not None
    shared = cfg.workers.snapshot_dir is not None
    if port is None and cfg.http.port_per_rank:  # a rank of torchrun: http.port + LOCAL_RANK
        offset = ranks_from().port_offset()
        port = rank_port(cfg.http.port, offset, shared)
        if port > 65535:
            raise ConfigError("http.port", f"{cfg.http.port} + LOCAL_RANK {offset} = {port} is past 65535: "
                              "set a lower http.port, or http.port_per_rank: false")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535):
        raise ConfigError("http.port", f"must be an integer in 0..65535, got {port!r}")
    if host is not None and (not isinstance(host, str) or not host):
        raise ConfigError("http.host", f"must be a non-empty address, got {host!r}")
    return Server(rt, cfg.http.host if host is None else host, cfg.http.port if port is None else port,
                  cfg.http.token if token is None else token, port_count=cfg.http.port_count,
                  shared=shared)
