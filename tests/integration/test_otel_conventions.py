"""What the OpenTelemetry side owes the SDK and the semantic conventions, checked against a real
OTLP receiver over HTTP and over gRPC: the standard ``OTEL_*`` environment decides wherever our
config does not, the ``process.*`` semconv instruments, fixed span attribute keys, and the
per-layer duration histogram's buckets and switch."""
from __future__ import annotations

import os
import re
import time

import pytest
import torch
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from torch import nn

import memprof_otel as mp
from memprof_otel import __version__
from memprof_otel.export.otel import MAX_RETIRED_MODELS
from memprof_otel.runtime import runtime

from .support.helpers import wait_for
from .support.otlp_receiver import (OtlpGrpcReceiver, OtlpReceiver, attrs, metrics_of, points_of, spans_of,
                            value_of)

STANDARD_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                 "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
                 "OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
                 "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "OTEL_METRIC_EXPORT_INTERVAL",
                 "OTEL_METRICS_EXPORTER", "OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED",
                 "OTEL_RESOURCE_ATTRIBUTES", "OTEL_SERVICE_NAME", "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS")
ATTRIBUTION = {"every_n_forwards": 1, "overhead_budget": 1.0}


@pytest.fixture(params=["http/protobuf", "grpc"])
def receiver(request):
    r = OtlpReceiver() if request.param == "http/protobuf" else OtlpGrpcReceiver()
    yield r
    r.close()


@pytest.fixture
def otel_env(monkeypatch):
    for var in STANDARD_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    return monkeypatch


def start(receiver, **otel) -> None:
    service = otel.pop("service_name", None)
    cfg = {"sampler": {"interval": "50ms"},
           "otel": {"endpoint": receiver.url, "protocol": receiver.protocol, **otel}}
    if service:
        cfg["service_name"] = service
    mp.start_monitoring(cfg)


def last_metrics(receiver) -> dict:
    return {m.name: m for _, m in metrics_of(receiver.got("/v1/metrics"))}


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))


# ---- 1. the standard environment, where our config is silent -----------------------------------

@pytest.mark.timeout(60)
def test_the_standard_export_interval_applies_unless_the_config_sets_one(receiver, otel_env):
    otel_env.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")  # milliseconds, as the specification says
    start(receiver)
    # our default is 15 s: several exports within 3 s can only come from the variable
    assert wait_for(lambda: len(receiver.got("/v1/metrics")) >= 3, timeout=5.0)
    assert mp.shutdown(5) is True

    seen = len(receiver.got("/v1/metrics"))
    start(receiver, export_interval="1h")                  # explicit config beats the variable
    time.sleep(1.5)
    assert len(receiver.got("/v1/metrics")) == seen
    assert mp.shutdown(5) is True
    assert len(receiver.got("/v1/metrics")) == seen + 1   # the final export only


@pytest.mark.timeout(90)
@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_the_standard_timeouts_bound_each_signals_exports_unless_the_config_sets_one(otel_env, protocol):
    slow = OtlpReceiver(delay=10.0) if protocol == "http/protobuf" else OtlpGrpcReceiver(delay=10.0)
    rt = runtime()
    try:
        # GIVEN a collector that takes 10 s to answer, a 300 ms metrics timeout and a 20 s general one
        otel_env.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "20000")
        otel_env.setenv("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "300")
        before = dict(rt.counters.export_errors)
        grew = lambda k: rt.counters.export_errors.get(k, 0) - before.get(k, 0)  # noqa: E731
        start(slow, export_interval="100ms")
        with mp.operation("one-span"):
            pass
        # THEN metric exports give up after 300 ms, each counted; span exports still wait (20 s)
        assert wait_for(lambda: grew("otlp_metrics") >= 2, timeout=8.0), dict(rt.counters.export_errors)
        assert grew("otlp_traces") == 0
        mp.shutdown(2)

        # WHEN the config sets a timeout, it beats both variables
        otel_env.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "20000")
        otel_env.setenv("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "20000")
        before = dict(rt.counters.export_errors)
        start(slow, export_interval="100ms", export_timeout="300ms")
        with mp.operation("one-span"):
            pass
        assert wait_for(lambda: grew("otlp_metrics") >= 2 and grew("otlp_traces") >= 1, timeout=8.0), \
            dict(rt.counters.export_errors)
        t0 = time.monotonic()
        mp.shutdown(3)
        assert time.monotonic() - t0 < 4.5
    finally:
        slow.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("off", ["traces", "metrics"])
def test_a_signal_whose_standard_exporter_is_none_is_not_exported(receiver, otel_env, off):
    otel_env.setenv(f"OTEL_{off.upper()}_EXPORTER", "none")
    start(receiver)
    with mp.operation("job"):
        time.sleep(0.01)
    assert mp.shutdown(5) is True
    assert receiver.got(f"/v1/{off}") == []
    on = "metrics" if off == "traces" else "traces"
    assert receiver.got(f"/v1/{on}"), f"{on} should still be exported"

    start(receiver, **{off: True})                         # explicit config beats the variable
    with mp.operation("job"):
        time.sleep(0.01)
    assert mp.shutdown(5) is True
    assert receiver.got(f"/v1/{off}")


@pytest.mark.timeout(30)
def test_the_sdk_disabled_variable_turns_both_signals_off(otel_env):
    receiver = OtlpReceiver()
    try:
        otel_env.setenv("OTEL_SDK_DISABLED", "true")
        start(receiver, export_interval="100ms")
        with mp.operation("job") as rec:
            time.sleep(0.3)
        assert mp.shutdown(5) is True
        assert receiver.got("/v1/metrics") == [] and receiver.got("/v1/traces") == []
        assert rec.trace_id is None  # no span was recorded, not even on a global provider
    finally:
        receiver.close()


@pytest.mark.timeout(60)
def test_the_standard_resource_variables_beat_our_defaults_and_lose_to_explicit_config(receiver, otel_env):
    def resources() -> list[dict]:
        return ([res for res, _ in spans_of(receiver.got("/v1/traces"))]
                + [res for res, _ in metrics_of(receiver.got("/v1/metrics"))])

    def one_run(**kw) -> dict:
        receiver.requests = {p: [] for p in receiver.requests}
        start(receiver, **kw)
        with mp.operation("job"):
            pass
        assert mp.shutdown(5) is True
        got = resources()
        assert got and all(r == got[0] for r in got)
        return got[0]

    # defaults: our service name, a worker-unique instance id, our version
    res = one_run()
    assert res["service.name"] == "memprof-otel" and str(os.getpid()) in res["service.instance.id"]
    assert res["service.version"] == __version__
    # the standard variables win over our defaults
    otel_env.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.instance.id=pod-7,deployment.environment.name=prod")
    otel_env.setenv("OTEL_SERVICE_NAME", "from-env")
    res = one_run()
    assert (res["service.name"], res["service.instance.id"]) == ("from-env", "pod-7")
    assert res["deployment.environment.name"] == "prod"
    # explicit config wins over them
    res = one_run(service_name="explicit")
    assert (res["service.name"], res["service.instance.id"]) == ("explicit", "pod-7")


@pytest.mark.timeout(30)
def test_a_bad_standard_variable_is_counted_and_the_default_kept(otel_env, caplog):
    receiver = OtlpReceiver()  # (not over both protocols: a value is counted once per process)
    try:
        otel_env.setenv("OTEL_METRIC_EXPORT_INTERVAL", "15s")   # not milliseconds
        before = runtime().counters.config_errors["env"]
        start(receiver)
        assert runtime().counters.config_errors["env"] == before + 1
        assert any("OTEL_METRIC_EXPORT_INTERVAL" in r.getMessage() for r in caplog.records)
        time.sleep(1.0)
        assert receiver.got("/v1/metrics") == []               # the 15 s default kept, not 15 ms
        assert mp.shutdown(5) is True
    finally:
        receiver.close()


# ---- 2. semantic-convention process metrics ----------------------------------------------------

def _proc_io() -> dict[str, int] | None:
    try:
        with open("/proc/self/io", encoding="ascii") as f:
            return {k: int(v) for k, v in (line.split(": ") for line in f)}
    except OSError:
        return None


@pytest.mark.timeout(60)
def test_semconv_process_metrics_have_their_conventional_kind_unit_and_attributes(receiver, otel_env):
    cpu_before, io_before = os.times(), _proc_io()
    start(receiver, export_interval="200ms")
    with open(os.devnull, "wb") as f:  # some work for the counters
        for _ in range(200):
            f.write(os.urandom(4096))
    assert wait_for(lambda: "process.cpu.time" in last_metrics(receiver))
    assert mp.shutdown(5) is True
    cpu_after, io_after = os.times(), _proc_io()
    got = last_metrics(receiver)

    for name in ("process.memory.usage", "process.memory.virtual"):  # UpDownCounters: non-monotonic sums
        m = got[name]
        assert m.WhichOneof("data") == "sum" and not m.sum.is_monotonic and m.unit == "By"
        (p,) = points_of(m)
        assert value_of(p) > 0
    rss = value_of(points_of(got["memprof.process.resident_memory"])[0])
    assert value_of(points_of(got["process.memory.usage"])[0]) == rss  # the same figure, same export

    cpu = got["process.cpu.time"]
    assert cpu.WhichOneof("data") == "sum" and cpu.sum.is_monotonic and cpu.unit == "s"
    modes = {attrs(p.attributes)["cpu.mode"]: value_of(p) for p in points_of(cpu)}
    assert set(modes) == {"user", "system"}
    # bracketed by libc's times() of this very process, read before and after
    assert cpu_before.user - 0.02 <= modes["user"] <= cpu_after.user + 0.02
    assert cpu_before.system - 0.02 <= modes["system"] <= cpu_after.system + 0.02

    disk = got.get("process.disk.io")
    if io_before is None:  # no per-process I/O on this OS: no points, never made-up ones
        assert disk is None or not points_of(disk)
        return
    assert disk.WhichOneof("data") == "sum" and disk.sum.is_monotonic and disk.unit == "By"
    io = {attrs(p.attributes)["disk.io.direction"]: value_of(p) for p in points_of(disk)}
    assert set(io) == {"read", "write"}
    assert io_before["read_bytes"] <= io["read"] <= io_after["read_bytes"]
    assert io_before["write_bytes"] <= io["write"] <= io_after["write_bytes"]


# ---- 3. span attribute keys ------------------------------------------------------------------

_KEY = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*")


def _value(any_value):
    which = any_value.WhichOneof("value")
    v = getattr(any_value, which)
    return [_value(x) for x in v.values] if which == "array_value" else v


@pytest.mark.timeout(60)
def test_span_attribute_keys_are_fixed_and_the_device_is_a_value(receiver, otel_env):
    start(receiver)
    m = model()
    with torch.no_grad(), mp.operation("infer") as rec:
        m(torch.randn(64, 8))
    assert mp.shutdown(5) is True
    ((_, span),) = [(r, s) for r, s in spans_of(receiver.got("/v1/traces")) if s.name == "infer"]
    got = {kv.key: _value(kv.value) for kv in span.attributes}
    assert all(_KEY.fullmatch(k) for k in got), sorted(got)  # no device (cpu, cuda:0) inside a key
    if not rec.device_peak:  # no allocator readable here: no device attributes either
        assert "memprof.memory.device" not in got
        return
    devices = sorted(rec.device_peak)
    assert got["memprof.memory.devices"] == devices
    assert got["memprof.memory.devices_peak_bytes"] == [rec.device_peak[d] for d in devices]
    assert got["memprof.memory.device"] in devices
    assert got["memprof.memory.device_peak_bytes"] == rec.device_peak[got["memprof.memory.device"]]


# ---- 4. the per-layer duration histogram -------------------------------------------------------

LAYER_BOUNDS = [1e-05, 3e-05, 1e-04, 3e-04, 1e-03, 3e-03, 0.01, 0.03, 0.1, 0.3, 1.0]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("enabled", [True, False])
def test_layer_duration_histogram_has_layer_sized_buckets_and_can_be_turned_off(receiver, otel_env, enabled):
    start(receiver, layer_histogram=enabled)
    m = model()
    mp.instrument(m, name="seq", attribution=ATTRIBUTION)
    with torch.no_grad():
        for _ in range(3):
            m(torch.randn(16, 8))
    assert mp.shutdown(5) is True
    got = last_metrics(receiver)
    assert "memprof.layer.peak_increase" in got
    if not enabled:
        assert "memprof.layer.forward" not in got
        return
    hist = got["memprof.layer.forward"]
    assert hist.unit == "s"
    pts = {attrs(p.attributes)["layer"]: p for p in hist.histogram.data_points}
    assert set(pts) == {"", "0", "1", "2"}
    for layer, p in pts.items():
        assert list(p.explicit_bounds) == LAYER_BOUNDS
        assert len(p.bucket_counts) == len(LAYER_BOUNDS) + 1
        assert p.count == 3 and sum(p.bucket_counts) == 3     # one per forward, every forward attributed
        assert attrs(p.attributes) == {"model": "seq", "layer": layer, "device": "cpu"}
    # a layer is part of its model: its total time is at most the whole model's
    assert pts["0"].sum <= pts[""].sum


# ---- 5. an uninstrumented model's last figures ---------------------------------------------------

def test_an_uninstrumented_models_figures_are_collected_once_more_then_dropped(otel_env):
    # (the batch job over HTTP and gRPC: test_otel_final_export.py; this is the collection logic)
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    try:
        mp.start_monitoring({"sampler": {"interval": "50ms"}}, meter_provider=meters)

        def layers() -> set[tuple[str, str]]:
            data = reader.get_metrics_data()
            return {(p.attributes["model"], p.attributes["layer"])
                    for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                    if m.name == "memprof.layer.peak_increase" for p in m.data.data_points}

        m = model()
        h = mp.instrument(m, name="gone", attribution=ATTRIBUTION)
        with torch.no_grad():
            m(torch.randn(16, 8))
        h.uninstrument()
        # /metrics and the watchdog no longer see the model ...
        assert not any(lab["model"] == "gone" for lab, _ in
                       runtime().scrape.series(max_age_s=0).get("memprof_layer_peak_increase_bytes", []))
        # ... the next OTel collection does, once
        assert layers() == {("gone", ""), ("gone", "0"), ("gone", "1"), ("gone", "2")}
        assert layers() == set()
    finally:
        mp.shutdown(2)
        meters.shutdown()


def test_retired_figures_are_bounded_when_no_collection_ever_runs(otel_env):
    # a no-op meter provider never collects: models instrumented and uninstrumented in a loop
    # must not pile up figures in the exporter
    mp.start_monitoring({"sampler": {"interval": "50ms"}})
    assert runtime().otel is not None and runtime().otel.endpoint is None
    for i in range(MAX_RETIRED_MODELS + 20):
        m = nn.Linear(4, 4)
        h = mp.instrument(m, name=f"short-lived-{i}", attribution=ATTRIBUTION)
        with torch.no_grad():
            m(torch.randn(2, 4))
        h.uninstrument()
    retired = runtime().otel._retired["memprof_layer_peak_increase_bytes"]
    assert len(retired) == MAX_RETIRED_MODELS
    assert f"short-lived-{MAX_RETIRED_MODELS + 19}" in retired and "short-lived-0" not in retired
