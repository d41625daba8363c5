"""What a dead collector is allowed to say: one line when exports start failing, then at most one
line per ``period_s`` with the count of failures since, and one line when they succeed again.

The OTLP exporters of the SDK log an ERROR on every failed export (every 15 s per signal, forever,
for a collector that is down). Our counting wrappers run those exports inside ``quiet_sdk_logs()``,
which keeps the SDK's records of *our* exports (only ours: the application's own exporters log as
they always did) and hands the last one to the report as the reason. Every failure is still
counted in ``memprof_export_errors_total{exporter}``; this is only about the log.

``FailureReport`` is pure (the clock is passed in); ``ExportFailureLog`` writes its lines.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .._log import logger

REPORT_PERIOD_S = 300.0  # at most one "still failing" line per exporter per 5 minutes


@dataclass
class _State:
    first_s: float
    line_s: float
    total: int = 1
    since_line: int = 0
    reason: str = ""


class FailureReport:
    """Decides which export outcomes deserve a log line; returns (level, message) or None."""

    def __init__(self, period_s: float = REPORT_PERIOD_S) -> None:
        self.period_s = period_s
        self._failing: dict[str, _State] = {}
        self._lock = threading.Lock()

    def failed(self, name: str, target: str, reason: str, now: float) -> tuple[int, str] | None:
        with self._lock:
            st = self._failing.get(name)
            if st is None:
                self._failing[name] = _State(first_s=now, line_s=now, reason=reason)
                return logging.WARNING, (
                    f"memprof_otel: {name} export to {target} failed ({reason or 'no reason given'}); "
                    f"counted in memprof_export_errors_total{{exporter=\"{name}\"}}, reported again at "
                    f"most every {self.period_s / 60:g} min while it lasts")
            st.total += 1
            st.since_line += 1
            st.reason = reason or st.reason
            if now - st.line_s < self.period_s:
                return None
            n, elapsed = st.since_line, now - st.line_s
            st.since_line, st.line_s = 0, now
            return logging.WARNING, (
                f"memprof_otel: {name} export to {target} still failing: {n} failed exports in the last "
                f"{_ago(elapsed)}, {st.total} since it started {_ago(now - st.first_s)} ago "
                f"(last: {st.reason or 'no reason given'})")

    def succeeded(self, name: str, target: str, now: float) -> tuple[int, str] | None:
        with self._lock:
            st = self._failing.pop(name, None)
        if st is None:
            return None
        return logging.INFO, (f"memprof_otel: {name} export to {target} recovered after {st.total} failed "
                              f"exports over {_ago(now - st.first_s)}")


class ExportFailureLog:
    """``FailureReport`` with a logger and the monotonic clock."""

    def __init__(self, period_s: float = REPORT_PERIOD_S, log: logging.Logger = logger,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.report = FailureReport(period_s)
        self._log = log
        self._clock = clock

    def failed(self, name: str, target: str, reason: str) -> None:
        self._emit(self.report.failed(name, target, reason, self._clock()))

    def succeeded(self, name: str, target: str) -> None:
        self._emit(self.report.succeeded(name, target, self._clock()))

    def _emit(self, line: tuple[int, str] | None) -> None:
        if line is not None:
            self._log.log(line[0], "%s", line[1])


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# ---- keeping the SDK quiet about our own exports ---------------------------------------------

_inside = threading.local()  # set while this thread runs one of our exports


class _Captured:
    reason: str = ""


class _OurExportFilter(logging.Filter):
    """Drops the SDK exporters' records emitted inside one of our exports (same thread), keeping
    the first one's text as the failure's reason."""

    def filter(self, record: logging.LogRecord) -> bool:
        captured: _Captured | None = getattr(_inside, "captured", None)
        if captured is None:
            return True
        if not captured.reason:
            try:
                captured.reason = record.getMessage()[:300]
            except Exception:  # a record whose arguments do not format: keep it out all the same
                captured.reason = str(record.msg)[:300]
        return False


_FILTER = _OurExportFilter()
_SDK_LOGGER_PREFIX = "opentelemetry.exporter.otlp"
_installed: set[str] = set()
_install_lock = threading.Lock()


def install_sdk_log_filter() -> None:
    """Put the filter on every OTLP exporter logger created so far (call once the exporters are
    imported: a logger filter sees only records logged on that very logger, not its children's)."""
    with _install_lock:
        for name in list(logging.root.manager.loggerDict):
            if name.startswith(_SDK_LOGGER_PREFIX) and name not in _installed:
                logging.getLogger(name).addFilter(_FILTER)
                _installed.add(name)


@contextlib.contextmanager
def quiet_sdk_logs() -> Iterator[_Captured]:
    """Within: the OTLP exporters' log records on this thread are captured, not written."""
    outer = getattr(_inside, "captured", None)
    captured = _Captured()
    _inside.captured = captured
    try:
        yield captured
    finally:
        _inside.captured = outer
