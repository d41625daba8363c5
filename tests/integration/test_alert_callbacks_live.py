"""Alert callbacks in a monitored process: a raising one and a blocking one next to a good one. The
good one gets the alert, the sampler ticks on (/healthz 200, the timeline grows), and the failure
is counted in memprof_export_errors_total{exporter="alert_callback"}."""
from __future__ import annotations

import threading
from typing import Any

import httpx

import memprof_otel as mp

from .support.helpers import scrape_values, wait_until

RSS = "memprof_process_resident_memory_bytes"


def test_a_raising_and_a_blocking_callback_cost_neither_the_good_one_nor_the_sampler() -> None:
    release = threading.Event()
    got: list[str] = []

    def raises(alert: dict[str, Any]) -> None:
        raise RuntimeError("a callback with a bug")

    def blocks(alert: dict[str, Any]) -> None:
        release.wait(60)

    def good(alert: dict[str, Any]) -> None:
        got.append(alert["rule"])

    for fn in (raises, good, blocks):
        mp.add_alert_callback(fn)
    try:
        mp.start_monitoring({"sampler": {"interval": "50ms"}, "watchdog": {"rules": [
            {"name": "rss_any", "metric": RSS, "op": ">", "threshold": 1, "actions": ["callback"]}]}})
        srv = mp.serve(port=0)
        c = httpx.Client(base_url=srv.url, timeout=30)
        wait_until(lambda: got == ["rss_any"], what="the good callback called")
        before = len(mp.timeline())
        # the blocking callback now holds its thread; the sampler must not wait for it
        wait_until(lambda: len(mp.timeline()) >= before + 10, what="ten more sampler ticks")
        assert c.get("/healthz").status_code == 200
        errors = scrape_values(c, "memprof_export_errors_total")
        assert errors[(("exporter", "alert_callback"),)] == 1
    finally:
        release.set()
        for fn in (raises, good, blocks):
            mp.remove_alert_callback(fn)
        mp.shutdown(2)
