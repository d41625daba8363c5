"""The leak watch between the sampler and the exporters: what it reads from a tick, the series it
publishes, and a watchdog rule on its growth metrics firing through the real watchdog."""
from __future__ import annotations

import logging
from typing import Any

import pytest

import memprof_otel as mp
from memprof_otel.config import LeaksConfig, WatchdogConfig
from memprof_otel.telemetry.leaks import ALLOCATOR, LAYER, PROCESS, LeakWatch, WatchKey, readings_of
from memprof_otel.timeline import Sample
from memprof_otel.watchdog.service import Watchdog

MiB = 1 << 20
CFG = LeaksConfig(floor_interval=1.0, trend_window=20.0, warmup=2.0, min_growth_bytes=4 * MiB)


def _sample(i: int, rss: float, allocated: float) -> Sample:
    return Sample(t=1_000.0 + i, process={"resident_memory_bytes": rss},
                  allocators={"cpu": {"allocated_bytes": allocated, "reserved_bytes": 2 * allocated}})


def test_readings_of_a_tick():
    r = readings_of(_sample(0, 5.0, 7.0), {("m", "blocks.0", "cpu"): 9})
    assert r == {WatchKey(PROCESS, "", "", ""): 5.0, WatchKey(ALLOCATOR, "", "", "cpu"): 7.0,
                 WatchKey(LAYER, "m", "blocks.0", "cpu"): 9.0}
    assert readings_of(Sample(t=0.0, process={}), {}) == {}  # an unreadable process: nothing watched


def _fed(n: int, surviving: dict[tuple[str, str, str], int] | None = None, layer_leak: int = 0) -> LeakWatch:
    """``n`` ticks, one a second: RSS flat, allocator leaking 1 MiB/s, one layer leaking ``layer_leak``."""
    state: dict[tuple[str, str, str], int] = dict(surviving or {})
    watch = LeakWatch(CFG, lambda: dict(state))
    for i in range(n):
        if layer_leak:
            state[("m", "hoard", "cpu")] = i * layer_leak
        watch.on_sample(_sample(i, 3_000 * MiB + (i % 7) * MiB, 1_000 * MiB + i * MiB))
    return watch


def test_series_carry_slopes_and_flags_with_their_own_labels():
    watch = _fed(40, {("m", "idle", "cpu"): 0}, layer_leak=MiB)
    s = watch.series()
    growth = {tuple(sorted(lab.items())): v for lab, v in s["memprof_memory_growth_bytes_per_second"]}
    assert growth[(("device", "cpu"), ("source", "allocator"))] == pytest.approx(MiB)
    assert abs(growth[(("device", ""), ("source", "process"))]) < 0.2 * MiB  # a flat sawtooth
    flags = {tuple(sorted(lab.items())): v for lab, v in s["memprof_memory_leak_suspected"]}
    assert flags == {(("device", "cpu"), ("source", "allocator")): 1.0, (("device", ""), ("source", "process")): 0.0}
    layer_flags = {lab["layer"]: v for lab, v in s["memprof_layer_leak_suspected"]}
    assert layer_flags == {"hoard": 1.0, "idle": 0.0}
    assert {lab["layer"] for lab, _ in s["memprof_layer_growth_bytes_per_second"]} == {"hoard", "idle"}
    assert all(set(lab) == {"model", "layer", "device"} for lab, _ in s["memprof_layer_leak_suspected"])


def test_no_slope_during_warmup_but_the_flag_is_there_from_the_first_tick():
    watch = _fed(2)
    s = watch.series()
    assert s["memprof_memory_growth_bytes_per_second"] == []
    assert sorted(v for _, v in s["memprof_memory_leak_suspected"]) == [0.0, 0.0]


def test_disabled_watches_nothing():
    watch = LeakWatch(LeaksConfig(enabled=False), dict)
    watch.on_sample(_sample(0, 1.0, 1.0))
    assert all(rows == [] for rows in watch.series().values())
    assert watch.report(5)["enabled"] is False


def test_report_lists_suspects_windows_and_top_layers():
    watch = _fed(40, {("m", "small", "cpu"): 10}, layer_leak=MiB)
    doc = watch.report(top=1)
    assert {(x["source"], x["layer"]) for x in doc["suspects"]} == {("allocator", ""), ("layer", "hoard")}
    hoard = next(x for x in doc["suspects"] if x["layer"] == "hoard")
    tr = hoard["trend"]
    assert tr["window_seconds"] == pytest.approx(19.0) and tr["points"] == 20
    assert doc["top_surviving_layers"] == [{"model": "m", "layer": "hoard", "device": "cpu",
                                            "surviving_bytes": 39 * MiB}]
    assert doc["params"]["trend_window_seconds"] == 20.0


def test_a_watchdog_rule_on_a_growth_metric_is_accepted_and_fires(caplog: Any):
    rules = mp.load_config({"watchdog": {"rules": [
        {"name": "layer_leak", "metric": "memprof_layer_leak_suspected", "op": ">=", "threshold": 1,
         "labels": {"model": "m"}},
        {"name": "alloc_growth", "metric": "memprof_memory_growth_bytes_per_second", "op": ">",
         "threshold": "512KiB", "labels": {"source": "allocator"}},
    ]}}, environ={}).watchdog.rules
    watch = _fed(40, layer_leak=MiB)
    wd = Watchdog(WatchdogConfig(rules=rules), series=watch.series, span_event=lambda *a: None,
                  dump_all=lambda reason: None, count_dump=lambda *a: None, callbacks=[])
    with caplog.at_level(logging.WARNING, logger="memprof_otel.watchdog"):
        wd.on_sample(_sample(41, 1.0, 1.0))
    firing = {(a["rule"], a["labels"].get("layer", a["labels"].get("source"))) for a in wd.alerts()
              if a["state"] == "firing"}
    assert firing == {("layer_leak", "hoard"), ("alloc_growth", "allocator")}
    assert "1.0 MiB/s" in caplog.text  # the slope, in the metric's unit


def test_a_rule_with_a_label_the_growth_metric_lacks_is_refused():
    with pytest.raises(mp.ConfigError) as e:
        mp.load_config({"watchdog": {"rules": [{"name": "x", "metric": "memprof_memory_growth_bytes_per_second",
                                                "op": ">", "threshold": 1, "labels": {"layer": "a"}}]}},
                       environ={})
    assert "has no label layer" in str(e.value)
