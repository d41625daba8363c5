"""The watchdog service: evaluates the pure ``AlertEngine`` on every sampler tick and runs actions.

Actions on an alert starting to fire: ``log`` (a warning), ``span_event`` (an OTel event),
``callback`` (functions registered with ``add_alert_callback``), ``dump`` (a deep capture of the
next forward of every live model, rate-limited by ``watchdog.dump_min_interval``, run off the
sampler thread). By default nothing here changes the process: no ``empty_cache``, no ``gc``.
What it reads and does outside itself (the series, the OTel event, the dump, the callbacks) it is
handed by the composition root.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any, Callable, Iterable

from .._callouts import calls_application
from .._log import rate_limited
from ..config import WatchdogConfig
from .rules import WatchdogRule
from ..metric_names import BY_PROM
from ..telemetry.series import Labels, Series
from ..timeline import Sample
from ..units import format_metric_value
from .engine import FIRING, RESOLVED, AlertEngine, Transition

log = logging.getLogger("memprof_otel.watchdog")

# One unit per series: a rule's threshold goes to the family of its metric's unit, so a graph or an
# aggregation over a family never mixes bytes with ratios (the unitless family keeps every rule
# while its mixed use is deprecated: docs/metric-stability.md).
_THRESHOLD_BY_UNIT = {"By": "memprof_watchdog_threshold_bytes", "s": "memprof_watchdog_threshold_seconds",
                      "1": "memprof_watchdog_threshold_ratio"}


def threshold_family(metric: str) -> str | None:
    """The unit-suffixed threshold family for a rule on ``metric``; None for a metric without a
    unit (counts, 0/1 states), whose threshold is only in ``memprof_watchdog_threshold``."""
    d = BY_PROM.get(metric)
    return _THRESHOLD_BY_UNIT.get(d.unit) if d is not None else None


AlertCallback = Callable[[dict[str, Any]], None]


def _labels(labels: dict[str, str]) -> str:
    """``{device="cuda:0"}`` as in PromQL, or nothing."""
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else ""


@calls_application
def _call_back(fn: AlertCallback, alert: dict[str, Any]) -> None:
    fn(dict(alert))  # a copy each: one callback changing it cannot change what the next one sees


# alerts waiting for the callbacks; past this a new one is dropped and counted (a callback that
# never returns would otherwise hold every later alert in memory)
CALLBACK_QUEUE = 256
_IDLE_EXIT_S = 5.0  # the callback thread ends after this long without an alert (started again on the next)


class _CallbackRunner:
    """Runs the user's alert callbacks on a thread of their own, one alert after another: a slow
    or blocking callback must not hold the sampler thread that evaluates the rules (its ticks feed
    ``/healthz``, the timeline and every other rule). Each callback runs in its own try, so one
    that raises does not keep the alert from the others. ``failed()`` counts each failure and each
    alert dropped because the queue was full."""

    def __init__(self, callbacks: list[AlertCallback], failed: Callable[[], None]) -> None:
        self._callbacks = callbacks
        self._failed = failed
        self._lock = threading.Lock()
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(CALLBACK_QUEUE)
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def submit(self, alert: dict[str, Any]) -> None:
        with self._lock:
            if self._pid != os.getpid():  # a forked child: its parent's thread and queue are not its own
                self._queue, self._thread, self._pid = queue.Queue(CALLBACK_QUEUE), None, os.getpid()
            try:
                self._queue.put_nowait(alert)
            except queue.Full:
                self._failed()
                rate_limited.warning("alert-callback-dropped", "memprof_otel: alert %s not handed to the "
                                     "callbacks: %d alerts wait for a callback that has not returned",
                                     alert.get("rule"), CALLBACK_QUEUE)
                return
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="memprof-alert-callbacks", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                alert = self._queue.get(timeout=_IDLE_EXIT_S)
            except queue.Empty:
                with self._lock:  # nothing came in between: this thread ends, submit() starts another
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            for fn in list(self._callbacks):
                try:
                    _call_back(fn, alert)
                except Exception as e:
                    self._failed()
                    rate_limited.warning(f"alert-callback:{getattr(fn, '__qualname__', fn)}",
                                         "memprof_otel: alert callback %r failed: %r", fn, e)
            self._queue.task_done()

    def join_idle(self, timeout: float) -> bool:
        """Wait until every alert handed over has been through the callbacks (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._queue.unfinished_tasks == 0:
                return True
            time.sleep(0.01)
        return False


class Watchdog:
    """``series()``: the figures a scrape shows, fresh; ``span_event(name, attributes)``: an OTel
    event (no-op without OTel); ``dump_all(reason)``: capture every live model; ``count_dump(format,
    result)``: the dumps counter; ``callbacks``: the user's alert callbacks (a live list)."""

    def __init__(self, cfg: WatchdogConfig, *, series: Callable[[], Series],
                 span_event: Callable[[str, dict[str, Any]], None], dump_all: Callable[[str], Any],
                 count_dump: Callable[[str, str], None], callbacks: list[AlertCallback],
                 count_error: Callable[[str], None] = lambda action: None) -> None:
        self._series = series
        self._span_event = span_event
        self._dump_all = dump_all
        self._count_dump = count_dump
        self._count_error = count_error  # memprof_export_errors_total{exporter="alert_<action>"}
        self.cfg = cfg
        self._lock = threading.Lock()
        self.engine = AlertEngine(cfg.rules)
        self._last_dump = float("-inf")
        self.action_errors = 0
        self.dump_threads: list[threading.Thread] = []
        self.callbacks = _CallbackRunner(callbacks, lambda: self._action_failed("callback"))

    def _action_failed(self, action: str) -> None:
        self.action_errors += 1
        self._count_error(f"alert_{action}")

    # ---- rules -----------------------------------------------------------------------------
    @property
    def rules(self) -> tuple[WatchdogRule, ...]:
        with self._lock:
            return self.engine.rules

    def set_rules(self, rules: Iterable[WatchdogRule]) -> None:
        with self._lock:
            self.engine.set_rules(rules)

    def alerts(self) -> list[dict[str, Any]]:
        with self._lock:
            return self.engine.alerts()

    # ---- evaluation ------------------------------------------------------------------------
    def on_sample(self, sample: Sample) -> None:
        if not self.engine.rules:
            return
        values = self._series()
        with self._lock:
            transitions = self.engine.evaluate(values, sample.t)
        for tr in transitions:
            if tr.new in (FIRING, RESOLVED):
                self._act(tr)

    def _act(self, tr: Transition) -> None:
        r = tr.rule
        alert = {"rule": r.name, "severity": r.severity, "state": tr.new, "metric": r.metric, "op": r.op,
                 "threshold": r.threshold, "value": tr.value, "labels": tr.labels, "at": tr.at}
        if tr.new == RESOLVED:
            if "log" in r.actions:
                log.info("memprof_otel: alert %s resolved (%s%s = %s)", r.name, r.metric, _labels(tr.labels),
                         format_metric_value(r.metric, tr.value))
            return
        for action in r.actions:
            try:
                if action == "log":
                    level = logging.ERROR if r.severity == "critical" else logging.WARNING
                    log.log(level, "memprof_otel: alert %s firing: %s%s %s %s (value %s)", r.name, r.metric,
                            _labels(tr.labels), r.op, format_metric_value(r.metric, r.threshold),
                            format_metric_value(r.metric, tr.value))
                elif action == "span_event":
                    self._span_event("memprof.alert", {
                        "memprof.alert.rule": r.name, "memprof.alert.severity": r.severity,
                        "memprof.alert.metric": r.metric, "memprof.alert.value": tr.value,
                        "memprof.alert.threshold": r.threshold})
                elif action == "callback":
                    self.callbacks.submit(alert)  # run on their own thread, never the sampler's
                elif action == "dump":
                    self._dump(r)
            except Exception as e:  # an action failing must not stop the others or the sampler
                self._action_failed(action)
                rate_limited.warning(f"alert-action:{action}", "memprof_otel: alert action %s failed: %r",
                                     action, e)

    def _dump(self, rule: WatchdogRule) -> None:
        now = time.monotonic()
        if now - self._last_dump < self.cfg.dump_min_interval:
            self._count_dump("speedscope", "rate_limited")
            return
        self._last_dump = now
        t = threading.Thread(target=self._dump_all, args=(f"alert:{rule.name}",), name="memprof-alert-dump",
                             daemon=True)
        self.dump_threads.append(t)
        t.start()

    # ---- metrics ---------------------------------------------------------------------------
    def series(self) -> dict[str, list[tuple[Labels, float]]]:
        with self._lock:
            rules = self.engine.rules
            fired = self.engine.fired_total()
            active = {r.name: self.engine.active_count(r.name) for r in rules}
        out: dict[str, list[tuple[Labels, float]]] = {
            "memprof_alert_active": [], "memprof_watchdog_alerts_total": [], "memprof_watchdog_threshold": []}
        for r in rules:
            lab = {"rule": r.name, "severity": r.severity}
            out["memprof_alert_active"].append((lab, 1.0 if active[r.name] else 0.0))
            out["memprof_watchdog_alerts_total"].append((lab, float(fired.get((r.name, r.severity), 0))))
            out["memprof_watchdog_threshold"].append((lab, r.threshold))
            if (family := threshold_family(r.metric)) is not None:
                out.setdefault(family, []).append((lab, r.threshold))
        return out
