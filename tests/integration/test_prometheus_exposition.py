"""What Prometheus reads from /metrics: valid exposition (checked by the real promtool), every
catalog family with HELP and TYPE, bounded and vanishing series, windowed peaks, scrapes that read
no device, and OpenMetrics exemplars carrying the operation's trace id."""
from __future__ import annotations

import gzip
import http.client
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text
from torch import nn

import memprof_otel as mp
from tests import reference_doc
from tests.integration.support.helpers import JSON_HEADERS, Traffic, wait_until
from memprof_otel.metric_names import METRICS
from memprof_otel.sources import registry

from .support.models import F32, Transient, Tree

EVERY = {"every_n_forwards": 1, "overhead_budget": 1.0}
OPENMETRICS = {"Accept": "application/openmetrics-text; version=1.0.0"}
LAYER_FAMILIES = [d.prom for d in METRICS if "layer" in d.labels]
# one series per layer that ever kept a storage past an attributed forward (docs/reference.md, Leaks)
SURVIVOR_FAMILIES = {"memprof_layer_surviving_bytes", "memprof_layer_growth_bytes_per_second",
                     "memprof_layer_leak_suspected"}


pytestmark = pytest.mark.timeout(60)  # a server that hangs fails the test, not the run

# ---- helpers --------------------------------------------------------------------------------

def samples(text: str, openmetrics: bool = False) -> list[Any]:
    parse = parse_openmetrics if openmetrics else parse_text
    return [s for fam in parse(text) for s in fam.samples]


def values(client: httpx.Client, name: str, **match: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for s in samples(client.get("/metrics").text):
        if s.name == name and all(s.labels.get(k) == v for k, v in match.items()):
            out[tuple(sorted(s.labels.items()))] = s.value
    return out


def layer_values(client: httpx.Client, name: str, model: str) -> dict[str, float]:
    return {dict(k)["layer"]: v for k, v in values(client, name, model=model).items()}


def populate(client: httpx.Client, model: nn.Module) -> None:
    """Traffic with operations, a firing watchdog rule and one dump: every non-GPU family has data."""
    rule = {"name": "rss_any", "metric": "memprof_process_resident_memory_bytes", "op": ">", "threshold": 1}
    assert client.put("/v1/watchdog/rules", json={"rules": [rule]}).status_code == 200
    with Traffic(model, op="generate"):
        assert client.post("/v1/dumps", params={"timeout": 10, "wait": 30}).status_code == 200
        wait_until(lambda: values(client, "memprof_alert_active", rule="rss_any"), what="the alert series")


# ---- the exposition itself ------------------------------------------------------------------

def test_promtool_check_metrics_is_clean_under_traffic(client):
    promtool = shutil.which("promtool") or ("/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None)
    if promtool is None:
        pytest.fail("promtool not found: install it with `apt-get install -y prometheus` (CI does)")
    model = Tree()
    mp.instrument(model, name="tree", **EVERY)
    populate(client, model)
    text = client.get("/metrics").content
    assert b"memprof_operation_duration_seconds_bucket" in text and b"memprof_dumps_total" in text
    p = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(), (
        f"promtool check metrics (rc {p.returncode}):\n{p.stdout.decode()}{p.stderr.decode()}")


def test_reference_metric_list_is_the_catalog():
    # docs/reference.md lists every family /metrics serves, and names no other
    assert set(reference_doc.documented_metrics()) == {d.prom for d in METRICS}
    assert reference_doc.metric_names_mentioned() <= {d.prom for d in METRICS}


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text", "openmetrics"])
def test_every_catalog_family_has_help_and_type(client, openmetrics):
    mp.instrument(Tree(), name="tree")
    text = client.get("/metrics", headers=OPENMETRICS if openmetrics else {}).text
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, re.M))
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    for d in METRICS:
        if openmetrics:  # OpenMetrics names counter and info families without their suffix
            name, want = d.family, d.kind
        else:  # the classic text format has no info type: info metrics are gauges named *_info
            name, want = d.prom, ("gauge" if d.kind == "info" else d.kind)
        assert types.get(name) == want, (d.prom, types.get(name))
        assert helps.get(name) == d.help, d.prom
    assert {n for n in types if n.startswith("memprof_")} == {
        (d.family if openmetrics else d.prom) for d in METRICS}


def test_series_of_a_model_disappear_after_uninstrument(client):
    keep, gone = Tree(), Tree()
    hk = mp.instrument(keep, name="keep", **EVERY)
    hg = mp.instrument(gone, name="gone", **EVERY)
    keep(torch.randn(4, 8))
    gone(torch.randn(4, 8))

    def models_in_scrape() -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for s in samples(client.get("/metrics").text):
            if "model" in s.labels:
                out.setdefault(s.labels["model"], set()).add(s.name)
        return out

    before = models_in_scrape()
    assert before["gone"] == before["keep"]
    assert {"memprof_layer_peak_increase_bytes", "memprof_layer_forward_seconds_count",
            "memprof_overhead_seconds_total", "memprof_events_dropped_total"} <= before["gone"]
    hg.uninstrument()
    after = models_in_scrape()
    assert "gone" not in after and after["keep"] == before["keep"]
    hk.uninstrument()
    assert models_in_scrape() == {}


def test_layers_past_max_layers_fold_into_other(client):
    full, folded = Tree(), Tree()
    mp.instrument(full, name="full", **EVERY)
    mp.instrument(folded, name="folded", max_layers=2, **EVERY)
    x = torch.randn(4, 8)
    full(x)
    folded(x)
    assert len(list(folded.named_modules())) == 5
    for fam in LAYER_FAMILIES:
        name = fam + ("_count" if fam.endswith("_seconds") else "")
        layers = {dict(k)["layer"] for k in values(client, name, model="folded")}
        if fam in SURVIVOR_FAMILIES:
            # only layers that kept a storage past a forward: the output, born in b.1, folded
            assert layers <= {"__other__"}, (fam, layers)
            continue
        # CPU layers have no fragmentation figure: the family is absent for them, never a fake 0
        expected = set() if fam == "memprof_layer_fragmentation_ratio" else {"", "a", "__other__"}
        assert layers == expected, (fam, layers)
    assert {dict(k)["layer"] for k in values(client, "memprof_layer_surviving_bytes", model="folded")} == {"__other__"}
    # the folded series holds the largest of the layers folded into it
    f = layer_values(client, "memprof_layer_peak_increase_bytes", "full")
    o = layer_values(client, "memprof_layer_peak_increase_bytes", "folded")
    assert o["__other__"] == max(f["b"], f["b.0"], f["b.1"]) == 20000 * F32 + 4 * 8 * F32
    assert o["a"] == f["a"] == 1000 * F32 and o[""] == f[""]
    calls = layer_values(client, "memprof_layer_forward_seconds_count", "folded")
    assert calls == {"": 1.0, "a": 1.0, "__other__": 3.0}  # b, b.0 and b.1 each called once


class OneTransient(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.t = Transient(1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.t(x)


def test_layer_peaks_are_those_of_the_last_completed_window(client):
    model = OneTransient()
    h = mp.instrument(model, name="win", window="1s", **EVERY)
    x = torch.randn(2)
    origin = h._windows._start  # the window grid's origin (perf_counter), to stay clear of edges

    def window_start(k: int) -> None:
        """Sleep until 0.1 s into the k-th window from now (k=1: the next one)."""
        now = time.perf_counter()
        idx = int((now - origin) // 1.0) + k
        time.sleep(max(0.0, origin + idx + 0.1 - now))

    def peak() -> float:
        return layer_values(client, "memprof_layer_peak_increase_bytes", "win")["t"]

    def forward_with(n: int) -> None:
        model.t.n = n
        model(x)

    # window A: a big and a small call
    window_start(1)
    forward_with(50_000)
    forward_with(10_000)
    # window B: only a small call; A is the last completed window -> A's maximum
    window_start(1)
    forward_with(2_000)
    assert peak() == 50_000 * F32
    assert layer_values(client, "memprof_layer_retained_bytes", "win")["t"] == 2 * F32  # x + 1 kept
    # window C: B completed -> B's figures, read the same by every scraper in the window
    window_start(1)
    assert peak() == 2_000 * F32
    time.sleep(0.3)
    assert peak() == 2_000 * F32
    # window D: C had no call: the layer keeps its last figures rather than blinking out
    window_start(1)
    assert peak() == 2_000 * F32


def test_a_scrape_reads_no_source(client, monkeypatch):
    model = Tree()
    mp.instrument(model, name="tree", **EVERY)
    model(torch.randn(4, 8))
    from memprof_otel.runtime import runtime

    rt = runtime()
    wait_until(lambda: rt.sampler.latest() is not None and rt.sampler.latest().process and
               "cpu" in rt.sampler.latest().allocators, what="a full sample")
    # GIVEN the sampler holds still (its last sample stays the latest, and no read of a source it
    # asked for is still running: on a loaded machine one may end after the stop) ...
    readers = [w._thread for w in rt.sampler._workers.values()]
    assert rt.sampler.stop(2.0)
    wait_until(lambda: not any(t.is_alive() for t in readers), what="the sampler's source readers to end")
    last = rt.sampler.latest()
    calls: list[str] = []

    def boom(name: str) -> Any:
        def read(*a: Any, **k: Any) -> Any:
            calls.append(name)
            raise OSError(f"{name}: the scrape must not read sources")
        return read

    # ... and every read method of the process and host-allocator sources raises
    for src in (registry.process(), registry.host_allocator()):
        assert src is not None
        for meth in ("stats", "read", "reading", "refresh", "maybe_read", "allocated", "reserved",
                     "peak_since_reset", "_read", "_sample"):
            if hasattr(src, meth):
                monkeypatch.setattr(src, meth, boom(f"{type(src).__name__}.{meth}"))
    # WHEN scraped a few times, in both formats
    for headers in ({}, OPENMETRICS, {}):
        assert client.get("/metrics", headers=headers).status_code == 200
    # THEN nothing was read, and the figures are the last sample's, exactly
    assert calls == []
    assert values(client, "memprof_process_resident_memory_bytes")[()] == last.process["resident_memory_bytes"]
    assert values(client, "memprof_allocator_allocated_bytes", device="cpu") == {
        (("device", "cpu"),): last.allocators["cpu"]["allocated_bytes"]}
    assert values(client, "memprof_sampler_last_success_timestamp_seconds")[()] == pytest.approx(last.t)
    assert layer_values(client, "memprof_layer_peak_increase_bytes", "tree")["a"] == 1000 * F32
    assert calls == []


def test_openmetrics_exemplars_carry_the_operation_trace_id(tmp_path):
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    mp.start_monitoring({"sampler": {"interval": "50ms"}}, tracer_provider=provider)
    srv = mp.serve(port=0)
    model = Tree()
    mp.instrument(model, name="tree")
    for _ in range(3):
        with mp.operation("generate"):
            model(torch.randn(4, 8))
    trace_ids = {format(s.context.trace_id, "032x") for s in spans.get_finished_spans() if s.name == "generate"}
    last = max((s for s in spans.get_finished_spans() if s.name == "generate"), key=lambda s: s.end_time)
    assert len(trace_ids) == 3
    with httpx.Client(base_url=srv.url, timeout=30, headers=JSON_HEADERS) as c:
        om = c.get("/metrics", headers=OPENMETRICS)
        text = c.get("/metrics")
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    for fam in ("memprof_operation_duration_seconds", "memprof_operation_memory_peak_bytes"):
        buckets = [s for s in samples(om.text, openmetrics=True)
                   if s.name == fam + "_bucket" and s.labels.get("operation") == "generate"]
        with_ex = [s for s in buckets if s.exemplar is not None]
        assert with_ex, fam
        for s in with_ex:
            assert set(s.exemplar.labels) == {"trace_id"} and s.exemplar.labels["trace_id"] in trace_ids
            le = float(s.labels["le"])
            assert s.exemplar.value <= le  # the exemplar's value falls in its bucket
        assert format(last.context.trace_id, "032x") in {s.exemplar.labels["trace_id"] for s in with_ex}
    # the classic text format has no exemplars, and no trace id ever becomes a label
    assert "trace_id" not in text.text and "# {" not in text.text
    assert all("trace_id" not in s.labels for s in samples(om.text, openmetrics=True))
    srv.close()


# ---- exposition conventions: units, gzip ----------------------------------------------------

_UNIT_SUFFIXES = ("bytes", "seconds", "ratio", "cores")  # the base units our names end in


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text", "openmetrics"])
def test_openmetrics_names_the_unit_of_every_family_whose_name_ends_in_one(client, openmetrics):
    mp.instrument(Tree(), name="tree")
    text = client.get("/metrics", headers=OPENMETRICS if openmetrics else {}).text
    units = dict(re.findall(r"^# UNIT (\S+) (\S+)$", text, re.M))
    if not openmetrics:
        assert units == {}  # the text format 0.0.4 has no UNIT line
        return
    types = re.findall(r"^# TYPE (\S+) ", text, re.M)
    expected = {name: name.rsplit("_", 1)[1] for name in types
                if name.startswith("memprof_") and name.rsplit("_", 1)[1] in _UNIT_SUFFIXES}
    assert units == expected
    assert units["memprof_process_cpu_seconds"] == "seconds"  # a counter's family has no _total
    assert "memprof_process_cpu_utilization_ratio" in units and "memprof_alert_active" not in units


def _raw_get(port: int, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """GET /metrics with nothing decoded (httpx would inflate gzip on its own; the stdlib client
    leaves Content-Encoding alone)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers=headers)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


@pytest.mark.parametrize("accept_encoding, compressed", [
    ("gzip", True), ("gzip, deflate, br", True), ("identity;q=1, *;q=0.5", True), ("GZip;q=0.8", True),
    ("gzip;q=0", False), ("identity", False), ("", False), ("br", False)])
def test_metrics_is_gzipped_when_the_scraper_takes_it(server, accept_encoding, compressed):
    mp.instrument(Tree(), name="tree")
    headers = {"Accept-Encoding": accept_encoding} if accept_encoding else {}
    status, got_headers, body = _raw_get(server.port, headers)
    assert status == 200 and "accept-encoding" in got_headers.get("vary", "").lower()
    if compressed:
        assert got_headers.get("content-encoding") == "gzip"
        text = gzip.decompress(body).decode()
        assert int(got_headers["content-length"]) == len(body) < len(text)
    else:
        assert "content-encoding" not in got_headers
        text = body.decode()
    # the same exposition either way: every catalog family, parseable
    names = {fam.name for fam in parse_text(text)}
    assert {d.family if d.kind == "counter" else d.prom for d in METRICS} <= names
