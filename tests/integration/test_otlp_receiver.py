"""OTLP/HTTP export to a real receiver running in the test: spans per operation, the catalog's
metrics, the resource, and the ``OTEL_EXPORTER_OTLP_ENDPOINT`` path."""
from __future__ import annotations

import time

import pytest
import torch
from torch import nn

import memprof_otel as mp
from memprof_otel.runtime import runtime

from .support.helpers import wait_for
from .support.otlp_receiver import OtlpReceiver, attrs, metrics_of, spans_of

@pytest.fixture
def receiver():
    r = OtlpReceiver()
    yield r
    r.close()


@pytest.fixture
def clean_otel_env(monkeypatch):
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
                "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def small_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))


ATTRIBUTION = {"window": "1s", "every_n_forwards": 1, "overhead_budget": 1.0}


@pytest.mark.timeout(60)
def test_spans_metrics_and_resource_reach_a_real_otlp_receiver(receiver, clean_otel_env):
    # GIVEN monitoring that exports to the receiver every 200 ms
    errors_before = {k: v for k, v in runtime().counters.export_errors.items() if v}
    mp.start_monitoring({"service_name": "memprof-it", "sampler": {"interval": "50ms"},
                         "otel": {"endpoint": receiver.url, "protocol": "http/protobuf",
                                  "export_interval": "200ms"}})
    model = small_model()
    mp.instrument(model, name="seq", attribution=ATTRIBUTION)
    # WHEN operations run forwards
    with torch.no_grad():
        with mp.operation("load", model="seq") as load:
            model(torch.randn(16, 8))
        with mp.operation("generate") as gen:
            for _ in range(3):
                with mp.operation("step"):
                    model(torch.randn(16, 8))
    # metrics arrive periodically, before any shutdown, the layers' figures included
    assert wait_for(lambda: "memprof.layer.peak_increase" in
                    {m.name for _, m in metrics_of(receiver.got("/v1/metrics"))})
    t0 = time.monotonic()
    assert mp.shutdown(5) is True
    assert time.monotonic() - t0 < 5.5
    assert not receiver.bad

    # THEN every operation is a span with its memory figures
    spans = spans_of(receiver.got("/v1/traces"))
    names = sorted(s.name for _, s in spans)
    assert names == ["generate", "load", "step", "step", "step"]
    by = {}
    for res, s in spans:
        a = attrs(s.attributes)
        assert a["memprof.memory.peak_bytes"] > 0
        assert isinstance(a["memprof.memory.delta_bytes"], int)
        by.setdefault(s.name, []).append((res, s, a))
    (_, load_span, load_attrs), = by["load"]
    assert load_attrs["memprof.memory.peak_bytes"] == load.peak_bytes
    assert load_attrs["memprof.memory.delta_bytes"] == load.delta_bytes
    assert load_attrs["memprof.model"] == "seq"
    (_, gen_span, _), = by["generate"]
    assert all(s.parent_span_id == gen_span.span_id and s.trace_id == gen_span.trace_id
               for _, s, _ in by["step"])
    assert gen.trace_id == gen_span.trace_id.hex()

    # the resource names the service and this worker
    metrics = metrics_of(receiver.got("/v1/metrics"))
    resources = [res for res, _ in spans] + [res for res, _ in metrics]
    assert all(r["service.name"] == "memprof-it" for r in resources)
    ids = {r.get("service.instance.id") for r in resources}
    assert len(ids) == 1 and ids.pop()

    # the catalog's metrics arrived, with their data
    names = {m.name for _, m in metrics}
    assert {"memprof.process.resident_memory", "memprof.layer.peak_increase",
            "memprof.operation.duration", "process.memory.usage"} <= names
    last = {m.name: m for _, m in metrics}  # cumulative: the last export has everything
    rss = last["memprof.process.resident_memory"]
    (point,) = rss.gauge.data_points
    assert rss.unit == "By" and getattr(point, point.WhichOneof("value")) > 0
    layers = {attrs(p.attributes)["layer"] for p in last["memprof.layer.peak_increase"].gauge.data_points}
    assert layers == {"", "0", "1", "2"}
    dur = {attrs(p.attributes)["operation"]: p.count for p in last["memprof.operation.duration"].histogram.data_points}
    assert dur == {"load": 1, "generate": 1, "step": 3}
    assert {k: v for k, v in runtime().counters.export_errors.items() if v} == errors_before  # every export succeeded


@pytest.mark.timeout(60)
def test_the_standard_endpoint_variable_is_honoured(receiver, clean_otel_env):
    clean_otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    mp.start_monitoring({"service_name": "from-env", "sampler": {"interval": "50ms"},
                         "otel": {"export_interval": "200ms"}})
    assert runtime().config.otel.endpoint is None
    with mp.operation("env-op"):
        time.sleep(0.01)
    assert wait_for(lambda: receiver.got("/v1/metrics"))
    assert mp.shutdown(5) is True
    spans = spans_of(receiver.got("/v1/traces"))
    assert [s.name for _, s in spans] == ["env-op"]
    assert spans[0][0]["service.name"] == "from-env"
    assert "memprof.process.resident_memory" in {m.name for _, m in metrics_of(receiver.got("/v1/metrics"))}
