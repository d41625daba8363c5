"""Operations and phases on the real runtime: context, nesting, report/timeline/plot over memory the
test controls, operation metrics, and OTel spans and metrics through injected SDK providers."""
from __future__ import annotations

import asyncio
import os
import re
import socket
import threading
import time

import pytest
import torch
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from torch import nn

import memprof_otel as mp
from memprof_otel.config import OtelConfig
from memprof_otel.export.otel import OtelExporter
from memprof_otel.runtime import runtime
from memprof_otel.sources import registry
from tests.integration.support.helpers import collector_paused, wait_for

MiB = 1 << 20
FAST = {"sampler": {"interval": "20ms"}}


def wait_ticks(n: int) -> None:
    """Wait for ``n`` sampler ticks that read the process: on a busy machine a 20 ms tick can miss
    its deadline and carry no process figures (seen: three such ticks, and an operation's 64 MiB
    transient unseen), which the tests below would take for a peak that was not there."""
    s = runtime().sampler
    start = s.ticks
    mark = s.latest()
    since = mark.t if mark is not None else 0.0

    def read() -> int:
        return sum(1 for x in s.samples(since) if x is not mark and x.rss > 0)

    assert wait_for(lambda: s.ticks >= start + n and read() >= n), "the sampler is not reading the process"


@pytest.fixture
def otel_sdk():
    """SDK providers the application owns, with in-memory export."""
    spans = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    mp.start_monitoring(FAST, tracer_provider=tp, meter_provider=meters)
    yield spans, reader
    mp.shutdown(2)
    tp.shutdown()
    meters.shutdown()


def by_name(spans) -> dict:
    out = {}
    for s in spans:
        assert s.name not in out, f"two spans named {s.name}"
        out[s.name] = s
    return out


# ---- context ------------------------------------------------------------------------------

def test_operation_as_context_manager_records_and_restores_context():
    mp.start_monitoring(FAST)
    assert mp.current_operation() is None
    with mp.operation("load", model="m1", step=3) as rec:
        assert mp.current_operation() is rec
        assert rec.open and rec.name == "load" and rec.kind == "operation"
        assert rec.attributes == {"model": "m1", "step": 3}
        time.sleep(0.05)
    assert mp.current_operation() is None
    assert not rec.open and rec.duration >= 0.05
    assert rec.rss_start > 0 and rec.rss_end > 0 and rec.peak_bytes >= max(rec.rss_start, rec.rss_end)
    assert rec in runtime().tracker.records()


def test_operation_as_decorator_on_a_sync_function():
    mp.start_monitoring(FAST)

    @mp.operation("embed", model="enc")
    def embed(x, *, scale=1):
        """doc"""
        return x * scale, mp.current_operation()

    v, rec1 = embed(2, scale=3)
    _, rec2 = embed(1)
    assert v == 6 and embed.__name__ == "embed" and embed.__doc__ == "doc"
    assert rec1.name == rec2.name == "embed" and rec1 is not rec2
    assert rec1.attributes == {"model": "enc"}
    assert not rec1.open and not rec2.open
    assert mp.current_operation() is None


def test_operation_as_decorator_on_an_async_function():
    mp.start_monitoring(FAST)

    @mp.operation("agen")
    async def agen(n):
        await asyncio.sleep(0.01)
        return n, mp.current_operation()

    assert asyncio.iscoroutinefunction(agen)
    n, rec = asyncio.run(agen(5))
    assert n == 5 and rec.name == "agen" and not rec.open and rec.duration >= 0.01


def test_operation_as_decorator_on_generators_spans_the_iteration():
    mp.start_monitoring(FAST)

    @mp.operation("stream")
    def stream(n):
        """doc"""
        for i in range(n):
            time.sleep(0.05)  # the work of each item happens while it is iterated
            yield i, mp.current_operation()
        return "done"

    @mp.operation("astream")
    async def astream(n):
        for i in range(n):
            await asyncio.sleep(0.05)
            yield i, mp.current_operation()

    assert stream.__name__ == "stream" and stream.__doc__ == "doc"
    items = []
    gen = stream(3)
    assert mp.current_operation() is None  # called, not iterated yet: no operation
    while True:
        try:
            items.append(next(gen))
        except StopIteration as stop:
            assert stop.value == "done"  # the generator's return value gets through
            break
    assert [i for i, _ in items] == [0, 1, 2]
    rec = items[0][1]
    assert rec.name == "stream" and all(r is rec for _, r in items) and not rec.open
    assert rec.duration >= 0.15  # the three items' work, not the call that made the generator

    async def consume():
        return [x async for x in astream(3)]

    got = asyncio.run(consume())
    arec = got[0][1]
    assert [i for i, _ in got] == [0, 1, 2] and arec.name == "astream" and not arec.open
    assert arec.duration >= 0.15


def test_nested_operations_link_to_their_parent():
    mp.start_monitoring(FAST)
    with mp.operation("outer") as outer:
        with mp.operation("inner") as inner:
            with mp.operation("leaf") as leaf:
                pass
        assert mp.current_operation() is outer
    assert outer.parent_id is None
    assert inner.parent_id == outer.id and leaf.parent_id == inner.id


def test_threads_have_their_own_current_operation():
    mp.start_monitoring(FAST)
    both_open = threading.Barrier(2, timeout=5)
    seen: dict[str, object] = {}

    def worker():
        seen["before"] = mp.current_operation()
        with mp.operation("in-thread") as mine:
            both_open.wait()
            with mp.operation("thread-child") as child:
                seen["child"] = child
            seen["current"] = mp.current_operation()
            seen["mine"] = mine
            both_open.wait()

    with mp.operation("in-main") as main_op:
        t = threading.Thread(target=worker)
        t.start()
        both_open.wait()
        assert mp.current_operation() is main_op
        both_open.wait()
        t.join(5)
    assert seen["before"] is None  # a new thread does not inherit the creator's operation
    assert seen["current"] is seen["mine"]
    assert seen["child"].parent_id == seen["mine"].id != main_op.id
    assert seen["mine"].parent_id is None


def test_concurrent_asyncio_tasks_each_see_their_own_operation():
    mp.start_monitoring(FAST)

    async def task(name: str, go: asyncio.Event, ready: list, out: dict):
        async with mp.operation(name) as rec:
            ready.append(name)
            await go.wait()  # both operations are open here, interleaved on one thread
            out[name] = mp.current_operation()
            with mp.operation(name + ".step") as step:
                await asyncio.sleep(0.01)
            out[name + ".step"] = step
        assert rec is out[name]

    async def main():
        go, ready, out = asyncio.Event(), [], {}
        tasks = [asyncio.create_task(task(n, go, ready, out)) for n in ("a", "b")]
        while len(ready) < 2:
            await asyncio.sleep(0)
        go.set()
        await asyncio.gather(*tasks)
        return out

    out = asyncio.run(main())
    assert out["a"].name == "a" and out["b"].name == "b"
    assert out["a.step"].parent_id == out["a"].id
    assert out["b.step"].parent_id == out["b"].id
    assert mp.current_operation() is None


def test_mark_operation_ends_the_previous_phase():
    mp.start_monitoring(FAST)
    a = mp.mark_operation("load")
    time.sleep(0.02)
    assert a.open and a.kind == "phase"
    b = mp.mark_operation("compile", step=1)
    assert not a.open and a.end <= b.start and b.open and b.attributes == {"step": 1}
    mp.end_phase()
    assert not b.open
    names = [r.name for r in runtime().tracker.records()]
    assert names == ["load", "compile"]


# ---- report, timeline, plot over controlled memory -----------------------------------------

@pytest.mark.timeout(60)
def test_three_phase_report_timeline_and_plot(tmp_path):
    mp.start_monitoring(FAST)
    wait_ticks(2)
    # GIVEN three phases, only the second of which holds 200 MiB (written, so it is resident)
    mp.mark_operation("prepare")
    time.sleep(0.3)
    mp.mark_operation("allocate")
    held = torch.ones(200 * MiB // 4)
    time.sleep(0.4)
    # freed before the next phase begins: a tick between the mark and the free (seen on a busy
    # machine) would put the 200 MiB in "release"
    del held
    mp.mark_operation("release")
    time.sleep(0.3)
    mp.end_phase()
    wait_ticks(2)

    # WHEN
    text = mp.report()
    tl = mp.timeline()

    # THEN the peak is in phase 2, and the report says so
    recs = {r.name: r for r in runtime().tracker.records()}
    alloc = recs["allocate"]
    assert alloc.rss_peak - recs["prepare"].rss_start >= 150 * MiB
    assert "Peak during:    allocate" in text
    numbered = [ln for ln in text.splitlines() if re.match(r"^\s*\d+\.\s+[\d.]+s - ", ln)]
    assert len(numbered) == 3
    assert [re.search(r"- (\S+)", ln).group(1) for ln in numbered] == ["prepare", "allocate", "release"]
    assert [re.match(r"^\s*(\d+)\.", ln).group(1) for ln in numbered] == ["1", "2", "3"]
    assert [ln.endswith("<- Peak") for ln in numbered] == [False, True, False]

    # the timeline's arrays line up, and the largest RSS falls inside phase 2
    n = len(tl.timestamps)
    assert n >= 30
    assert len(tl.rss_bytes) == len(tl.cpu_ratio) == len(tl.io_read_bytes) == len(tl.io_write_bytes) == n
    assert all(len(v) == n for v in tl.allocated.values())
    t_peak = tl.timestamps[tl.rss_bytes.index(max(tl.rss_bytes))]
    assert alloc.start <= t_peak <= alloc.end
    assert [o.name for o in tl.operations] == ["prepare", "allocate", "release"]

    # the plot is a real PNG
    out = tmp_path / "timeline.png"
    mp.plot(out)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000


# ---- operation metrics ---------------------------------------------------------------------

def test_operation_histograms_and_last_delta_series():
    mp.start_monitoring(FAST)
    kept = []
    recs = {"grow": [], "shrink": []}
    # the deltas are RSS at the end minus RSS at the start: a collection of earlier tests' garbage
    # inside an operation (the report test's figure alone frees ~6 MiB) would move them. The
    # tensors are large because statm's RSS is the kernel's per-CPU counters read without folding
    # (proc(5): "inaccurate because of a kernel-internal scalability optimization"): on a machine
    # with many CPUs it can lag by tens of MiB — a CI run saw one 48 MiB free still counted
    with collector_paused():
        for _ in range(3):
            with mp.operation("grow") as r:
                kept.append(torch.ones(160 * MiB // 4))
            recs["grow"].append(r)
        with mp.operation("shrink") as r:
            kept.clear()
        recs["shrink"].append(r)

    snap = runtime().op_stats.snapshot()
    assert set(snap) == {"grow", "shrink"}
    for name, rs in recs.items():
        f = snap[name]
        assert f.duration.count == f.peak.count == len(rs)
        assert f.duration.sum == pytest.approx(sum(x.duration for x in rs))
        assert f.peak.sum == pytest.approx(sum(x.peak_bytes for x in rs))
        assert f.last_delta == rs[-1].delta_bytes
    assert recs["grow"][-1].delta_bytes >= 80 * MiB
    assert recs["shrink"][0].delta_bytes <= -320 * MiB

    series = dict((lab["operation"], v) for lab, v in
                  runtime().scrape.series(max_age_s=0)["memprof_operation_memory_delta_bytes"])
    assert series == {"grow": float(recs["grow"][-1].delta_bytes),
                      "shrink": float(recs["shrink"][0].delta_bytes)}


def test_peak_increase_is_the_operations_own_need_not_the_level(otel_sdk):
    # GIVEN 256 MiB already held before the operation starts
    _, reader = otel_sdk
    before = torch.ones(256 * MiB // 4)
    wait_ticks(2)
    # WHEN the operation holds a transient 64 MiB (across sampler ticks) and frees it
    with mp.operation("transient") as rec:
        transient = torch.ones(64 * MiB // 4)
        wait_ticks(3)
        del transient
    # THEN its own increase is the 64 MiB (RSS and the host allocator both see it; a little noise
    # from the process's other threads), while the peak level also counts the 256 MiB held before
    assert 60 * MiB <= rec.peak_increase_bytes <= 64 * MiB + 16 * MiB, rec
    assert rec.peak_bytes >= 256 * MiB + 60 * MiB
    f = runtime().op_stats.snapshot()["transient"]
    assert f.peak_increase.count == 1 and f.peak_increase.sum == rec.peak_increase_bytes
    assert f.peak.sum == rec.peak_bytes
    # the 256 MiB bucket (64 MiB < x <= 256 MiB) has it, not the level's 1 GiB one
    buckets = dict((le, n) for le, n, _ in f.peak_increase.cumulative())
    assert buckets[str(64 * MiB)] == 0 and buckets[str(256 * MiB)] == 1
    # AND the OTel histogram carries the same figure
    (pt,) = [p for p in _metrics(reader)["memprof.operation.memory_peak_increase"].data.data_points
             if p.attributes == {"operation": "transient"}]
    assert pt.count == 1 and pt.sum == rec.peak_increase_bytes
    del before


# ---- spans -------------------------------------------------------------------------------

def test_a_span_per_operation_with_memory_attributes_and_parents(otel_sdk):
    spans, _ = otel_sdk
    with mp.operation("request", model="gpt") as outer:
        with mp.operation("forward") as inner:
            x = torch.ones(16 * MiB // 4)
        del x
    got = by_name(spans.get_finished_spans())
    assert set(got) == {"request", "forward"}
    req, fwd = got["request"], got["forward"]
    assert fwd.parent is not None and fwd.parent.span_id == req.context.span_id
    assert fwd.context.trace_id == req.context.trace_id and req.parent is None
    assert outer.trace_id == format(req.context.trace_id, "032x")
    for span, rec in ((req, outer), (fwd, inner)):
        assert span.attributes["memprof.memory.peak_bytes"] == rec.peak_bytes
        assert span.attributes["memprof.memory.delta_bytes"] == rec.delta_bytes
        assert span.attributes["memprof.operation.kind"] == "operation"
        assert span.status.status_code == StatusCode.UNSET
        assert "memprof.oom" not in span.attributes
    assert req.attributes["memprof.model"] == "gpt" and req.attributes["model"] == "gpt"
    assert "memprof.model" not in fwd.attributes


def test_phases_become_spans_too(otel_sdk):
    spans, _ = otel_sdk
    mp.mark_operation("warmup")
    mp.mark_operation("serve")
    mp.end_phase()
    got = by_name(spans.get_finished_spans())
    assert set(got) == {"warmup", "serve"}
    assert got["warmup"].attributes["memprof.operation.kind"] == "phase"
    assert got["warmup"].end_time <= got["serve"].start_time


def test_oom_in_an_operation_marks_the_span_and_propagates_unchanged(otel_sdk):
    spans, _ = otel_sdk
    raised = []
    with pytest.raises(RuntimeError) as info:
        with mp.operation("too-big") as rec:
            try:
                torch.empty(2**62, dtype=torch.uint8)
            except RuntimeError as e:
                raised.append(e)
                raise
    assert info.value is raised[0]
    assert "can't allocate memory" in str(info.value)
    assert rec.oom is True and rec.error == "RuntimeError" and not rec.open
    span = by_name(spans.get_finished_spans())["too-big"]
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["memprof.oom"] is True
    events = [e for e in span.events if e.name == "exception"]
    assert len(events) == 1
    assert events[0].attributes["exception.type"] == "RuntimeError"
    assert "can't allocate memory" in events[0].attributes["exception.message"]
    assert runtime().op_stats.snapshot()["too-big"].duration.count == 1


def test_a_non_oom_error_is_an_error_but_not_an_oom(otel_sdk):
    spans, _ = otel_sdk
    err = ValueError("bad input")
    with pytest.raises(ValueError) as info:
        with mp.operation("validate"):
            raise err
    assert info.value is err
    span = by_name(spans.get_finished_spans())["validate"]
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["memprof.oom"] is False
    assert [e.name for e in span.events] == ["exception"]


# ---- OTel metrics --------------------------------------------------------------------------

def _metrics(reader) -> dict:
    out = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out[m.name] = m
    return out


@pytest.mark.timeout(60)
def test_otel_metrics_cover_process_allocator_layers_and_operations(otel_sdk):
    _, reader = otel_sdk
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
    h = mp.instrument(model, name="seq", attribution={"window": "1s", "every_n_forwards": 1,
                                                      "overhead_budget": 1.0})
    wait_ticks(2)
    for _ in range(4):
        with mp.operation("infer"), torch.no_grad():
            model(torch.randn(32, 8))
    got = _metrics(reader)

    rss = got["memprof.process.resident_memory"]
    assert rss.unit == "By"
    (pt,) = rss.data.data_points
    assert pt.value in {s.rss for s in runtime().sampler.samples()} and pt.value > 0

    if registry.host_allocator() is not None:
        alloc = got["memprof.allocator.allocated"]
        pts = {p.attributes["device"]: p.value for p in alloc.data.data_points}
        assert pts.get("cpu", 0) > 0

    peaks = got["memprof.layer.peak_increase"]
    exported = h.exported_layer_peaks()
    layer_pts = {p.attributes["layer"]: p for p in peaks.data.data_points}
    assert set(layer_pts) == {"", "0", "1", "2"} == set(exported)
    for path, p in layer_pts.items():
        assert dict(p.attributes) == {"model": "seq", "layer": path, "device": "cpu"}
        assert p.value == exported[path].peak_increase
    assert layer_pts["0"].value >= 32 * 64 * 4  # Linear(8, 64) makes a 32x64 float output

    dur = got["memprof.operation.duration"]
    assert dur.unit == "s"
    (hp,) = [p for p in dur.data.data_points if p.attributes == {"operation": "infer"}]
    assert isinstance(hp, HistogramDataPoint) and hp.count == 4
    assert list(hp.explicit_bounds)[:2] == [0.005, 0.01]
    fwd = got["memprof.layer.forward"]
    assert {p.attributes["layer"] for p in fwd.data.data_points} >= {"0", "1", "2"}


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_owned_providers_carry_service_name_and_a_unique_instance_id():
    cfg = OtelConfig(endpoint=f"http://127.0.0.1:{_closed_port()}", export_interval=3600.0,
                     export_timeout=0.5)
    errors: list[str] = []
    a = OtelExporter(cfg, "svc-under-test", lambda: {}, errors.append)
    b = OtelExporter(cfg, "svc-under-test", lambda: {}, errors.append)
    try:
        for exp in (a, b):
            for res in (exp.tracer_provider.resource, exp.meter_provider._sdk_config.resource):
                assert res.attributes["service.name"] == "svc-under-test"
                assert res.attributes["service.instance.id"] == exp.instance_id
            assert str(os.getpid()) in exp.instance_id
        assert a.instance_id != b.instance_id
    finally:
        t0 = time.monotonic()
        a.shutdown(2.0)
        b.shutdown(2.0)
        assert time.monotonic() - t0 < 5.0


def test_injected_providers_are_used_and_not_owned():
    tp, meters = TracerProvider(), MeterProvider(metric_readers=[InMemoryMetricReader()])
    cfg = OtelConfig(endpoint=f"http://127.0.0.1:{_closed_port()}")
    exp = OtelExporter(cfg, "svc", lambda: {}, lambda _: None, tracer_provider=tp, meter_provider=meters)
    try:
        assert exp.tracer_provider is tp and exp.meter_provider is meters
        assert exp.shutdown(1.0) is True  # nothing of ours to stop: the application owns them
    finally:
        tp.shutdown()
        meters.shutdown()


def test_a_model_idle_for_a_whole_window_exports_its_layers_at_its_first_forwards():
    mp.start_monitoring(FAST)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
    h = mp.instrument(model, name="idle", attribution={"window": "1s", "every_n_forwards": 1,
                                                      "overhead_budget": 1.0})
    time.sleep(1.1)  # the first window ends without a single call
    with torch.no_grad():
        model(torch.randn(4, 8))
    assert set(h.exported_layer_peaks()) == {"", "0", "1"}
    rows = runtime().scrape.series(max_age_s=0)["memprof_layer_peak_increase_bytes"]
    assert {lab["layer"] for lab, _ in rows if lab["model"] == "idle"} == {"", "0", "1"}


def test_a_restart_does_not_serve_the_previous_runs_series():
    mp.start_monitoring(FAST)
    model = nn.Sequential(nn.Linear(8, 16))
    h = mp.instrument(model, name="gone", attribution={"every_n_forwards": 1, "overhead_budget": 1.0})
    model(torch.randn(2, 8))
    assert any(lab["model"] == "gone" for lab, _ in runtime().scrape.series()["memprof_layer_peak_increase_bytes"])
    h.uninstrument()
    mp.shutdown(2)
    mp.start_monitoring(FAST)
    rows = runtime().scrape.series().get("memprof_layer_peak_increase_bytes", [])  # within the cache age
    assert not any(lab["model"] == "gone" for lab, _ in rows)


def test_a_deep_capture_emits_nested_per_layer_spans_and_plain_forwards_none(otel_sdk):
    # GIVEN a nested model instrumented with an application's tracer provider
    spans, _ = otel_sdk
    model = nn.Sequential(nn.Linear(8, 16), nn.Sequential(nn.ReLU(), nn.Linear(16, 4)))
    h = mp.instrument(model, name="net", every_n_forwards=1, overhead_budget=1.0)
    model(torch.randn(2, 8))  # an attributed forward outside a capture: no layer spans
    assert not [s for s in spans.get_finished_spans() if s.name.startswith("layer ")]

    # WHEN one forward is deep-captured
    cap = h.capture(forwards=1)
    model(torch.randn(2, 8))
    assert cap.wait(5)

    # THEN one memprof.capture span holds a layer span per module call, nested like the modules
    done = spans.get_finished_spans()
    roots = [s for s in done if s.name == "memprof.capture"]
    assert len(roots) == 1 and roots[0].attributes["memprof.model"] == "net"
    layers = {s.attributes["memprof.layer"]: s for s in done if s.name.startswith("layer ")}
    assert set(layers) == {"net", "0", "1", "1.0", "1.1"}
    assert layers["net"].parent.span_id == roots[0].context.span_id
    assert layers["0"].parent.span_id == layers["net"].context.span_id
    assert layers["1.1"].parent.span_id == layers["1"].context.span_id
    assert all(s.start_time <= s.end_time for s in layers.values())
    assert layers["1"].start_time >= layers["0"].end_time
