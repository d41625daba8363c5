"""The watchdog adapter: evaluates the pure ``AlertEngine`` on every sampler tick and runs actions.

Actions on an alert starting to fire: ``log`` (a warning), ``span_event`` (an OTel event),
``callback`` (functions registered with ``add_alert_callback``), ``dump`` (a deep capture of the
next forward of every live model, rate-limited by ``watchdog.dump_min_interval``, run off the
sampler thread). By default nothing here changes the process: no ``empty_cache``, no ``gc``.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ._log import rate_limited
from .alerts import FIRING, RESOLVED, AlertEngine, Transition
from .config import WatchdogConfig, WatchdogRule
from .series import Labels
from .timeline import Sample
from .units import format_metric_value

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger("memprof_otel.watchdog")
AlertCallback = Callable[[dict[str, Any]], None]
_callbacks: list[AlertCallback] = []


def add_alert_callback(fn: AlertCallback) -> None:
    """Call ``fn(alert_dict)`` when a rule with the ``callback`` action starts firing."""
    _callbacks.append(fn)


def remove_alert_callback(fn: AlertCallback) -> None:
    try:
        _callbacks.remove(fn)
    except ValueError:
        pass


def _labels(labels: dict[str, str]) -> str:
    """``{device="cuda:0"}`` as in PromQL, or nothing."""
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else ""


class Watchdog:
    def __init__(self, rt: "Runtime", cfg: WatchdogConfig) -> None:
        self._rt = rt
        self.cfg = cfg
        self._lock = threading.Lock()
        self.engine = AlertEngine(cfg.rules)
        self._last_dump = float("-inf")
        self.action_errors = 0
        self.dump_threads: list[threading.Thread] = []

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
        values = self._rt.series(max_age_s=0.0)
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
                elif action == "span_event" and self._rt.otel is not None:
                    self._rt.otel.span_event("memprof.alert", {
                        "memprof.alert.rule": r.name, "memprof.alert.severity": r.severity,
                        "memprof.alert.metric": r.metric, "memprof.alert.value": tr.value,
                        "memprof.alert.threshold": r.threshold})
                elif action == "callback":
                    for fn in list(_callbacks):
                        fn(dict(alert))
                elif action == "dump":
                    self._dump(r)
            except Exception as e:  # an action failing must not stop the others or the sampler
                self.action_errors += 1
                rate_limited.warning(f"alert-action:{action}", "memprof_otel: alert action %s failed: %r",
                                     action, e)

    def _dump(self, rule: WatchdogRule) -> None:
        now = time.monotonic()
        if now - self._last_dump < self.cfg.dump_min_interval:
            self._rt.count_dump("speedscope", "rate_limited")
            return
        self._last_dump = now
        from .dumps import dump_service

        def run() -> None:
            dump_service().capture_all(reason=f"alert:{rule.name}", forwards=1, timeout=60.0)
        t = threading.Thread(target=run, name="memprof-alert-dump", daemon=True)
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
        return out
