"""Connections to the endpoint's own server that fail: counted by reason, logged at a bounded rate.

The standard library's server prints a full traceback for every connection that times out or that
the client resets, and drops a broken pipe without a word. An idle load balancer, a port scan or a
slow client would fill the application's log that way. Here every failed connection is one count in
``memprof_http_connection_errors_total{reason}`` and at most one log line per ``LOG_PERIOD_S``:

- ``timeout``: the client sent nothing, stopped sending or stopped reading for the socket timeout;
- ``reset``: the client reset or aborted the connection;
- ``broken_pipe``: the client closed the connection before the answer was written;
- ``other``: any other socket error;
- ``internal``: the endpoint's own code failed (a bug): logged with its traceback, never hidden.
"""
from __future__ import annotations

from typing import Any, Callable

from .._log import RateLimitedLog

REASONS: tuple[str, ...] = ("timeout", "reset", "broken_pipe", "other", "internal")

# Client-side failures say nothing about us: once every 5 minutes is enough to notice that they
# happen (the counter has the rate). A port scan or a load balancer's idle connections would
# otherwise write a line every minute, forever.
LOG_PERIOD_S = 300.0
_log = RateLimitedLog(period_s=LOG_PERIOD_S)

_FAMILY = "memprof_http_connection_errors_total"


def reason_for(exc: BaseException) -> str:
    """The ``reason`` label of a failure. Only the socket raises ``OSError`` on the transport's
    path (the routes catch their own errors), so any other exception is ours."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, BrokenPipeError):
        return "broken_pipe"
    if isinstance(exc, (ConnectionResetError, ConnectionAbortedError)):
        return "reset"
    return "other" if isinstance(exc, OSError) else "internal"


def _client(address: Any) -> str:
    """The client's host from a socket address tuple (or whatever the server was given)."""
    return str(address[0]) if isinstance(address, tuple) and address else str(address)


def connection_failed(count: Callable[[str], None], exc: BaseException, address: Any) -> None:
    """Count ``exc`` under its reason and log it rate-limited: the client's failures as one line
    without a traceback, ours with the traceback."""
    reason = reason_for(exc)
    count(reason)
    if reason == "internal":
        _log.warning("http-connection-internal",
                     "memprof_otel: the HTTP endpoint failed on a connection from %s; counted in "
                     "%s{reason=\"internal\"}", _client(address), _FAMILY, exc=exc)
    else:
        _log.warning("http-connection-client",
                     "memprof_otel: an HTTP connection from %s failed on the client's side (%s: %s); "
                     "counted in %s{reason}, logged at most every %g min",
                     _client(address), reason, exc, _FAMILY, LOG_PERIOD_S / 60)
