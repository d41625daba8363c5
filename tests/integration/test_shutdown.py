"""Shutdown goes on past a part that fails, returns False, and says in the log which part failed."""
from __future__ import annotations

import logging

from memprof_otel.runtime import runtime


class _BrokenServer:
    url = "http://127.0.0.1:1"

    def close(self) -> None:
        raise OSError("socket already gone")


def _broken_hook(timeout: float) -> None:
    raise RuntimeError("flush failed")


def test_each_failure_in_shutdown_is_logged_once_with_its_exception(monkeypatch, caplog):
    rt = runtime()
    closed: list[float] = []
    monkeypatch.setattr(rt, "_shutdown_hooks", [_broken_hook, closed.append])
    rt.servers.append(_BrokenServer())
    with caplog.at_level(logging.WARNING, logger="memprof_otel"):
        assert rt.shutdown(2) is False
    assert closed and rt.servers == []  # the parts after each failure still ran
    failures = [r for r in caplog.records if "shutdown:" in r.getMessage()]
    assert [r.getMessage() for r in failures] == [
        "memprof_otel: shutdown: closing the endpoint server at http://127.0.0.1:1 failed: "
        "OSError('socket already gone')",
        "memprof_otel: shutdown: shutdown hook _broken_hook failed: RuntimeError('flush failed')",
    ]
    assert [type(r.exc_info[1]) for r in failures] == [OSError, RuntimeError]


def test_a_clean_shutdown_logs_no_failure(caplog):
    with caplog.at_level(logging.WARNING, logger="memprof_otel"):
        assert runtime().shutdown(2) is True
    assert not [r for r in caplog.records if "shutdown:" in r.getMessage()]

