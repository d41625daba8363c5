"""Alert callbacks run on a thread of their own, each in its own try: one that raises does not keep
the alert from the others, one that blocks does not hold the sampler thread that evaluates the
rules, and what cannot be delivered is counted."""
from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from memprof_otel.config import WatchdogConfig
from memprof_otel.watchdog.rules import parse_rule
from memprof_otel.timeline import Sample
from memprof_otel.watchdog import service
from memprof_otel.watchdog.service import Watchdog

FRAG = "memprof_allocator_fragmentation_ratio"  # a gauge with a device label: one alert per device


def _watchdog(callbacks: list[Any], errors: Counter[str], names: tuple[str, ...] = ("r",)) -> tuple[Watchdog, dict]:
    rules = tuple(parse_rule({"name": n, "metric": FRAG, "op": ">", "threshold": 0.5, "actions": ["callback"],
                              "labels": {"device": n}}, f"r{i}") for i, n in enumerate(names))
    series: dict[str, list] = {FRAG: []}
    wd = Watchdog(WatchdogConfig(rules=rules), series=lambda: series, span_event=lambda name, attrs: None,
                  dump_all=lambda reason: None, count_dump=lambda fmt, result: None, callbacks=callbacks,
                  count_error=lambda exporter: errors.update([exporter]))
    return wd, series


def _fire(wd: Watchdog, series: dict, devices: tuple[str, ...], t: float) -> None:
    series[FRAG] = [({"device": d}, 0.9) for d in devices]
    wd.on_sample(Sample(t=t, process={}))


def test_a_callback_that_raises_does_not_keep_the_alert_from_the_others() -> None:
    got: list[tuple[str, str]] = []

    def bad(alert: dict[str, Any]) -> None:
        raise RuntimeError("boom")

    errors: Counter[str] = Counter()
    wd, series = _watchdog([bad, lambda a: got.append(("good", a["rule"]))], errors)
    _fire(wd, series, ("r",), 1.0)
    assert wd.callbacks.join_idle(5)
    assert got == [("good", "r")]
    assert errors == {"alert_callback": 1} and wd.action_errors == 1


def test_a_blocking_callback_does_not_hold_the_sampler_and_the_alerts_wait_their_turn() -> None:
    release = threading.Event()
    seen: list[str] = []

    def blocks(alert: dict[str, Any]) -> None:
        release.wait(30)
        seen.append(alert["rule"])

    errors: Counter[str] = Counter()
    wd, series = _watchdog([blocks], errors, names=("a", "b"))
    t0 = time.monotonic()
    _fire(wd, series, ("a",), 1.0)
    _fire(wd, series, ("a", "b"), 2.0)  # a second alert while the first callback blocks
    assert time.monotonic() - t0 < 1.0  # the sampler's tick went on
    assert {a["rule"]: a["state"] for a in wd.alerts()} == {"a": "firing", "b": "firing"}
    release.set()
    assert wd.callbacks.join_idle(5)
    assert seen == ["a", "b"] and not errors


def test_alerts_past_the_queue_are_dropped_and_counted(monkeypatch) -> None:
    monkeypatch.setattr(service, "CALLBACK_QUEUE", 2)
    release = threading.Event()
    errors: Counter[str] = Counter()
    wd, series = _watchdog([lambda a: release.wait(30)], errors, names=tuple("abcde"))
    for i, p in enumerate("abcde"):  # one new alert per tick: the first is taken, two wait, two dropped
        _fire(wd, series, tuple("abcde"[:i + 1]), float(i))
        time.sleep(0.05)
    assert errors == {"alert_callback": 2}
    release.set()
    assert wd.callbacks.join_idle(5)
