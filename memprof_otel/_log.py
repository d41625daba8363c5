"""Rate-limited logging for code that must never raise (hooks, sampler, exporters)."""
from __future__ import annotations

import logging
import threading
import time

logger = logging.getLogger("memprof_otel")


class RateLimitedLog:
    """At most one record per ``key`` per ``period_s``; the suppressed count rides on the next one."""

    def __init__(self, period_s: float = 60.0, log: logging.Logger = logger) -> None:
        self.period_s = period_s
        self._log = log
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, key: str, msg: str, *args: object, exc: BaseException | None = None) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.period_s:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return
            self._last[key] = now
            n = self._suppressed.pop(key, 0)
        suffix = f" ({n} similar messages suppressed)" if n else ""
        self._log.warning(msg + suffix, *args, exc_info=exc)


rate_limited = RateLimitedLog()


_warned: set[str] = set()
_warn_lock = threading.Lock()


def warn_once(key: str, msg: str, *args: object) -> None:
    """One WARNING per process for ``key`` (a degradation is worth saying once, not per forward)."""
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(msg, *args)
