"""``memprof-otel demo`` (MiniLM embeddings, real weights, under its synthetic traffic) as a user runs
it, one process checked in this order: its memory breakdown (``GET /v1/memory``) adds up to RSS with at
most 5 % unexplained; it exports every family, its app answers, and SIGTERM stops it cleanly (the last
test: it ends the process). The tests share the process: each start of the demo costs some 10 CPU s of
model loading and traffic before the first check can begin. (The dashboards' and rules' check runs a
demo of its own, whose OTLP collector is down: ``test_assets_against_demo.py``.)"""
from __future__ import annotations

import json
import math
import statistics
import time
import urllib.request
from typing import Iterator

import pytest

from tests.integration.support.breakdown_sums import MIB, TICK_BOUND, UNEXPLAINED_GOAL, check_sums
from tests.integration.support.demo_process import DemoHandle, parse, running_demo, value

# families the demo must export on a CPU host within seconds (GPU and cgroup-limit ones need those;
# per-layer fragmentation is measured on CUDA only)
DEMO_FAMILIES = [
    "memprof_layer_peak_increase_bytes", "memprof_layer_peak_allocated_bytes", "memprof_layer_retained_bytes",
    "memprof_layer_forward_seconds_count",
    "memprof_allocator_allocated_bytes", "memprof_allocator_reserved_bytes", "memprof_allocator_fragmentation_ratio",
    "memprof_process_resident_memory_bytes", "memprof_process_virtual_memory_bytes",
    "memprof_process_cpu_utilization_ratio", "memprof_process_cpu_seconds_total", "memprof_process_io_read_bytes_total",
    "memprof_operation_duration_seconds_count", "memprof_operation_memory_peak_bytes_bucket",
    "memprof_operation_memory_peak_increase_bytes_bucket",
    "memprof_operation_memory_delta_bytes", "memprof_alert_active", "memprof_watchdog_threshold",
    "memprof_watchdog_alerts_total", "memprof_overhead_seconds_total", "memprof_source_up",
    "memprof_sampler_duration_seconds", "memprof_sampler_last_success_timestamp_seconds", "memprof_build_info",
]


def post_json(url: str, doc: object, timeout: float = 60.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(doc).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoHandle]:
    with running_demo(tmp_path_factory.mktemp("demo")) as d:
        yield d


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_demo_leaves_at_most_five_percent_unexplained(demo: DemoHandle) -> None:
    """``GET /v1/memory`` on the running server, several ticks apart."""
    ratios = []
    for _ in range(5):
        with urllib.request.urlopen(demo.endpoint_url + "/v1/memory", timeout=10) as r:
            doc = json.load(r)
        cpu = doc["devices"]["cpu"]
        ratios.append(check_sums(cpu))
        assert cpu["components"]["weights"] > 20 * MIB  # MiniLM's 22.7 M parameters, float32
        time.sleep(1.5)
    print("demo: unexplained / RSS:", [f"{r:+.2%}" for r in ratios], "last:", json.dumps(cpu)[:2000])
    # the goal holds for the demo as a whole (the median tick); a single tick has reached +5.58 % (about
    # one in ten: the Python heap's figure is up to 5 s old while traffic moves it), so the ticks are
    # held to a looser bound that still fails a missing component (MiniLM's weights are ~20 % of RSS,
    # missing from every tick). On a loaded machine the components of one tick are read further apart:
    # one tick in five reached -16.6 % and +9.6 % there, the others within 2 % (the same before and
    # after the sources' back-off was shared), so one tick of the five may stray past it
    assert statistics.median(abs(r) for r in ratios) <= UNEXPLAINED_GOAL, ratios
    assert sum(abs(r) > TICK_BOUND for r in ratios) <= 1, ratios


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_demo_exports_every_family_serves_embeddings_and_stops_cleanly(demo: DemoHandle) -> None:
    # GIVEN the demo under its synthetic traffic (ready = MiniLM layers and embed operations exported)
    # WHEN we scrape it
    s = parse(demo.metrics())

    # THEN every family has data: MiniLM's layers, the embed operation, allocator, process, watchdog
    missing = [f for f in DEMO_FAMILIES if not s.get(f)]
    assert not missing, f"families without data: {missing}\n{demo.logs()}"
    layers = {lab["layer"] for lab, _ in s["memprof_layer_peak_increase_bytes"] if lab["model"] == "minilm"}
    assert {"encoder.layer.0", "encoder.layer.5.attention.self.query", "embeddings"} <= layers
    assert max(v for lab, v in s["memprof_layer_peak_increase_bytes"] if lab["model"] == "minilm") > 0
    assert (value(s, "memprof_operation_duration_seconds_count", operation="embed") or 0) > 0
    assert (value(s, "memprof_allocator_allocated_bytes", device="cpu") or 0) > 50e6  # 90 MB of weights
    assert (value(s, "memprof_process_resident_memory_bytes") or 0) > 100e6
    assert {lab["rule"] for lab, _ in s["memprof_watchdog_threshold"]} >= {"rss_near_limit", "sampler_slow"}

    # AND the app answers with 384-dim unit vectors
    texts = ["memory per layer", "a much longer sentence about where inference memory goes in a server"]
    doc = post_json(demo.app_url + "/embed", {"texts": texts})
    assert doc["dim"] == 384 and len(doc["embeddings"]) == 2
    for vec in doc["embeddings"]:
        assert len(vec) == 384
        assert math.isclose(math.sqrt(sum(x * x for x in vec)), 1.0, rel_tol=1e-4)
    assert doc["embeddings"][0] != doc["embeddings"][1]

    # WHEN it is told to stop (SIGTERM)
    code, seconds = demo.stop()

    # THEN it exits 0, quickly
    assert code == 0, demo.logs()
    assert seconds < 10.0
    assert "Traceback" not in demo.logs()
