"""Watchdog rules name series that exist (config and the real HTTP endpoint refuse the rest), and the
alert log speaks in the metric's unit."""
from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from typing import Any

import pytest

import memprof_otel as mp
from memprof_otel.config import WatchdogConfig
from memprof_otel.watchdog.rules import parse_rule
from memprof_otel.timeline import Sample
from memprof_otel.units import format_metric_value
from memprof_otel.watchdog.service import Watchdog

RSS = "memprof_process_resident_memory_bytes"


def _rule(**kw: Any) -> dict[str, Any]:
    return {"name": "r", "metric": RSS, "op": ">", "threshold": "1GiB", **kw}


@pytest.mark.parametrize("metric, fragment", [
    ("memprof_nope", "unknown metric 'memprof_nope'"),
    ("memprof_operation_duration_seconds", "is a histogram"),
    ("memprof_layer_forward_seconds", "is a summary"),
    ("memprof_build_info", "is a info"),
])
def test_rule_on_a_metric_the_watchdog_cannot_see_is_a_config_error(metric: str, fragment: str):
    with pytest.raises(mp.ConfigError) as e:
        mp.load_config({"watchdog": {"rules": [_rule(metric=metric)]}}, environ={})
    assert e.value.key == "watchdog.rules[0].metric"
    assert fragment in str(e.value) and metric in str(e.value)


def test_rule_label_the_metric_does_not_have_is_a_config_error():
    with pytest.raises(mp.ConfigError) as e:
        parse_rule(_rule(labels={"device": "cpu"}), "rules[0]")
    assert e.value.key == "rules[0].labels" and "device" in str(e.value)
    ok = parse_rule(_rule(metric="memprof_allocator_fragmentation_ratio", threshold=0.3,
                          labels={"device": "cuda:0"}), "rules[0]")
    assert ok.labels == (("device", "cuda:0"),)


def test_put_rules_with_an_unknown_metric_is_a_400_naming_it():
    srv = mp.serve(host="127.0.0.1", port=0)
    try:
        body = json.dumps({"rules": [_rule(metric="memprof_nope")]}).encode()
        req = urllib.request.Request(srv.url + "/v1/watchdog/rules", data=body, method="PUT",
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 400
        doc = json.loads(e.value.read())
        assert doc["error"] == "bad_rule" and "memprof_nope" in doc["detail"]
    finally:
        srv.close()


@pytest.mark.parametrize("metric, value, text", [
    (RSS, 21.5 * 2**30, "21.5 GiB"),
    ("memprof_allocator_inactive_split_bytes", 1536, "1.5 KiB"),
    ("memprof_allocator_fragmentation_ratio", 0.314, "31.4 %"),
    ("memprof_sampler_duration_seconds", 0.0123, "0.0123 s"),
    ("memprof_allocator_ooms_total", 3, "3"),
    ("memprof_sampler_last_success_timestamp_seconds", 0, "1970-01-01T00:00:00Z"),
])
def test_metric_values_in_human_units(metric: str, value: float, text: str):
    assert format_metric_value(metric, value) == text


class _Rt:
    """What the watchdog reads from the runtime: the series a scrape shows."""

    otel = None

    def __init__(self, series: dict[str, list[tuple[dict[str, str], float]]]) -> None:
        self._series = series

    def series(self, max_age_s: float = 0.0) -> dict[str, list[tuple[dict[str, str], float]]]:
        return self._series


def test_alert_log_lines_use_human_units(caplog: pytest.LogCaptureFixture):
    rules = (parse_rule(_rule(name="rss", threshold="20GiB"), "r0"),
             parse_rule(_rule(name="frag", metric="memprof_allocator_fragmentation_ratio", threshold=0.3,
                              labels={"device": "cuda:0"}), "r1"))
    rt = _Rt({RSS: [({}, 21.5 * 2**30)],
              "memprof_allocator_fragmentation_ratio": [({"device": "cuda:0"}, 0.42)]})
    wd = Watchdog(WatchdogConfig(rules=rules), series=rt.series, span_event=lambda name, attrs: None,
                  dump_all=lambda reason: None, count_dump=lambda fmt, result: None, callbacks=[])
    with caplog.at_level(logging.INFO, logger="memprof_otel.watchdog"):
        wd.on_sample(Sample(t=100.0, process={}))
        rt._series = {RSS: [({}, 1.0 * 2**30)], "memprof_allocator_fragmentation_ratio": []}
        wd.on_sample(Sample(t=101.0, process={}))
    text = caplog.text
    assert f"alert rss firing: {RSS} > 20.0 GiB (value 21.5 GiB)" in text
    assert 'alert frag firing: memprof_allocator_fragmentation_ratio{device="cuda:0"} > 30.0 % (value 42.0 %)' in text
    assert f"alert rss resolved ({RSS} = 1.0 GiB)" in text
    assert "23085449216" not in text  # no raw floats


def test_thresholds_are_exported_one_unit_per_family() -> None:
    rules = tuple(parse_rule(r, f"r{i}") for i, r in enumerate([
        {"name": "rss", "metric": RSS, "op": ">", "threshold": "20GiB"},
        {"name": "slow", "metric": "memprof_sampler_duration_seconds", "op": ">", "threshold": 0.5},
        {"name": "frag", "metric": "memprof_allocator_fragmentation_ratio", "op": ">", "threshold": 0.3},
        {"name": "ooms", "metric": "memprof_allocator_ooms_total", "op": ">", "threshold": 0}]))
    wd = Watchdog(WatchdogConfig(rules=rules), series=lambda: {}, span_event=lambda name, attrs: None,
                  dump_all=lambda reason: None, count_dump=lambda fmt, result: None, callbacks=[])
    got = {family: {lab["rule"]: v for lab, v in rows} for family, rows in wd.series().items()}
    assert got["memprof_watchdog_threshold_bytes"] == {"rss": 20 * 2**30}
    assert got["memprof_watchdog_threshold_seconds"] == {"slow": 0.5}
    assert got["memprof_watchdog_threshold_ratio"] == {"frag": 0.3}
    # the unitless family keeps every rule while its mixed use is deprecated; a count rule is only there
    assert got["memprof_watchdog_threshold"] == {"rss": 20 * 2**30, "slow": 0.5, "frag": 0.3, "ooms": 0.0}
