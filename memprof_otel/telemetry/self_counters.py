"""The counters memprof-otel keeps of itself: export errors, dumps, OOMs seen in forwards,
configuration values ignored, failed connections to its endpoint.

One object, which the composition root builds and whose bound methods it hands to the services that
count (the exporters, the dump service, the watchdog, the server); the scrape reads its figures. In a
forked child it renews itself (``fork_renewal.STATE``): the parent's events are the parent's series.
"""
from __future__ import annotations

import logging
import threading
from collections import Counter

from ..errors import ConfigError
from .fork_renewal import STATE

log = logging.getLogger("memprof_otel")


class SelfCounters:
    def __init__(self, http_connection_error_reasons: tuple[str, ...] = ()) -> None:
        # counters start at 0 for the labels every process has, so rate() and alerts see the first
        # increment (a series that appears at 1 hides it) and every family shows from the start
        self.export_errors: Counter[str] = Counter({"prometheus": 0})
        self.dumps: Counter[tuple[str, str]] = Counter({("speedscope", "ok"): 0, ("speedscope", "error"): 0})
        self.extra_ooms: Counter[str] = Counter()
        # configuration values the environment got wrong, each counted and logged once
        self.config_errors: Counter[str] = Counter({"env": 0})
        self._config_errors_seen: set[str] = set()
        self._lock = threading.Lock()
        # failed connections to our server, by reason; counted from its many connection threads at
        # once (an idle crowd times out together), where an unlocked ``+= 1`` would lose counts
        self.http_connection_errors: Counter[str] = Counter(dict.fromkeys(http_connection_error_reasons, 0))
        self._http_connection_errors_lock = threading.Lock()
        STATE.add(self.after_fork)

    def count_export_error(self, exporter: str) -> None:
        self.export_errors[exporter] += 1

    def count_dump(self, fmt: str, result: str) -> None:
        self.dumps[(fmt, result)] += 1

    def count_oom(self, device: str) -> None:
        self.extra_ooms[device] += 1

    def count_http_connection_error(self, reason: str) -> None:
        with self._http_connection_errors_lock:
            self.http_connection_errors[reason] += 1

    def expect_exporter(self, exporter: str) -> None:
        """Show ``exporter``'s error series from now on, at 0 until its first error."""
        self.export_errors.setdefault(exporter, 0)

    def config_error(self, source: str, err: ConfigError) -> None:
        """A configuration value ignored: counted and logged once per source and error."""
        seen = f"{source}:{err}"
        with self._lock:
            if seen in self._config_errors_seen:
                return
            self._config_errors_seen.add(seen)
            self.config_errors[source] += 1
        log.warning("memprof_otel: configuration value ignored (the config file's value, else the "
                    "default, stays in force): %s", err)

    def after_fork(self) -> None:
        """A forked child: fresh locks, and the parent's events no longer counted (configuration
        errors stay: the child runs with the same configuration)."""
        self._lock = threading.Lock()
        self._http_connection_errors_lock = threading.Lock()
        for counter in (self.export_errors, self.dumps, self.http_connection_errors):
            for key in counter:
                counter[key] = 0
        self.extra_ooms.clear()


__all__ = ["SelfCounters"]
