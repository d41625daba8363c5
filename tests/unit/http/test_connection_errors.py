"""Which reason a failed connection is counted under, and what it logs: the client's failures one
line without a traceback at most once per period, our own failures with their traceback."""
from __future__ import annotations

import logging
import socket

import pytest

from memprof_otel._log import RateLimitedLog
from memprof_otel.http import connection_errors
from memprof_otel.http.connection_errors import REASONS, connection_failed, reason_for


@pytest.mark.parametrize("exc,reason", [
    (socket.timeout("timed out"), "timeout"),  # the same class as TimeoutError since Python 3.10
    (TimeoutError(), "timeout"),
    (ConnectionResetError(104, "Connection reset by peer"), "reset"),
    (ConnectionAbortedError(103, "Software caused connection abort"), "reset"),
    (BrokenPipeError(32, "Broken pipe"), "broken_pipe"),
    (OSError(107, "Transport endpoint is not connected"), "other"),
    (RuntimeError("a bug"), "internal"),
    (ValueError("I/O operation on closed file"), "internal"),
])
def test_reason_for(exc: BaseException, reason: str) -> None:
    assert reason_for(exc) == reason
    assert reason in REASONS


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The list the counts go to, and a fresh log limiter (nothing logged before this test holds a line back)."""
    monkeypatch.setattr(connection_errors, "_log", RateLimitedLog(period_s=connection_errors.LOG_PERIOD_S))
    return []


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "memprof_http_connection_errors_total" in r.getMessage()]


def test_client_failures_are_all_counted_and_logged_once_without_a_traceback(counted, caplog):
    caplog.set_level(logging.INFO, logger="memprof_otel")
    for exc in (TimeoutError("timed out"), ConnectionResetError(104, "reset"), BrokenPipeError(32, "pipe")) * 10:
        connection_failed(counted.append, exc, ("10.0.0.7", 51234))
    assert sorted(set(counted)) == ["broken_pipe", "reset", "timeout"] and len(counted) == 30
    [line] = _records(caplog)
    assert line.levelno == logging.WARNING and line.exc_info is None
    assert "10.0.0.7" in line.getMessage() and "51234" not in line.getMessage()
    assert 'timeout' in line.getMessage()


def test_our_failures_are_logged_with_the_exception_apart_from_the_clients(counted, caplog):
    caplog.set_level(logging.INFO, logger="memprof_otel")
    connection_failed(counted.append, TimeoutError("timed out"), ("127.0.0.1", 1))
    try:
        raise RuntimeError("a bug")
    except RuntimeError as e:
        connection_failed(counted.append, e, ("127.0.0.1", 2))
    assert counted == ["timeout", "internal"]
    client, ours = _records(caplog)  # the client's line does not hold back ours
    assert client.exc_info is None
    assert ours.exc_info is not None and ours.exc_info[1].args == ("a bug",)
    assert 'reason="internal"' in ours.getMessage()
