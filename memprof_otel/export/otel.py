"""OpenTelemetry: the catalog's metrics as instruments, spans per operation, OTLP wiring.

Providers, in order: the ones the application injects; else our own SDK providers exporting over
OTLP when an endpoint is configured (``otel.endpoint`` or the standard ``OTEL_EXPORTER_OTLP_*``
variables); else the global API providers (a no-op unless the application set an SDK). Exports run
on the SDK's background threads, so a slow or dead collector never blocks a forward; each failed
export is counted in ``memprof_export_errors_total{exporter}``.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from typing import Any, Callable, Iterable, Mapping, Sequence

from opentelemetry import context as otel_context
from opentelemetry import metrics as otel_metrics
from opentelemetry import trace as otel_trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Status, StatusCode

from .._log import rate_limited
from .._version import __version__
from ..config import OtelConfig
from ..metric_names import DURATION_BUCKETS, MEMORY_PEAK_BUCKETS, METRICS, MetricDef
from ..timeline import OperationRecord

log = logging.getLogger("memprof_otel.otel")

SeriesFn = Callable[[], Mapping[str, Sequence[tuple[Mapping[str, str], float]]]]
ErrorFn = Callable[[str], None]
SCOPE = "memprof_otel"

# semconv process metrics, published next to ours (same figures, semconv names)
_SEMCONV = (("process.memory.usage", "By", "memprof_process_resident_memory_bytes"),
            ("process.memory.virtual", "By", "memprof_process_virtual_memory_bytes"),
            ("process.cpu.utilization", "1", "memprof_process_cpu_utilization_ratio"))


def otlp_endpoint(cfg: OtelConfig, environ: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    return cfg.endpoint or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or None


def otlp_protocol(cfg: OtelConfig, environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return cfg.protocol or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"


def instance_id() -> str:
    """Unique per worker process: host, pid and a random part (pids repeat across restarts)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class _CountingSpanExporter:
    """Wraps a span exporter: a failed or raising export is counted, never raised."""

    def __init__(self, inner: Any, on_error: ErrorFn, name: str) -> None:
        self._inner, self._on_error, self._name = inner, on_error, name

    def export(self, spans: Any) -> Any:
        # why: the OTel SDK loads only once we export through it
        from opentelemetry.sdk.trace.export import SpanExportResult

        try:
            result = self._inner.export(spans)
        except Exception as e:
            rate_limited.warning("export:" + self._name, "memprof_otel: %s export failed: %r", self._name, e)
            result = SpanExportResult.FAILURE
        if result != SpanExportResult.SUCCESS:
            self._on_error(self._name)
        return result

    def shutdown(self) -> None:
        try:
            self._inner.shutdown()
        except Exception:
            pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        try:
            return bool(self._inner.force_flush(timeout_millis))
        except Exception:
            return False


def _counting_metric_exporter(inner: Any, on_error: ErrorFn, name: str) -> Any:
    # why: the OTel SDK loads only once we export through it
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

    class CountingMetricExporter(MetricExporter):
        def __init__(self) -> None:
            super().__init__(preferred_temporality=getattr(inner, "_preferred_temporality", None),
                             preferred_aggregation=getattr(inner, "_preferred_aggregation", None))

        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
            try:
                result = inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
            except Exception as e:
                rate_limited.warning("export:" + name, "memprof_otel: %s export failed: %r", name, e)
                result = MetricExportResult.FAILURE
            if result != MetricExportResult.SUCCESS:
                on_error(name)
            return result

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            try:
                return bool(inner.force_flush(timeout_millis=timeout_millis))
            except Exception:
                return False

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            try:
                inner.shutdown(timeout_millis=timeout_millis)
            except Exception:
                pass

    return CountingMetricExporter()


class GrpcExtraMissing(ImportError):
    """OTLP over gRPC was asked for but the ``[grpc]`` extra is not installed."""


def _otlp_exporters(cfg: OtelConfig, endpoint: str, protocol: str) -> tuple[Any, Any]:
    timeout = cfg.export_timeout
    explicit = cfg.endpoint is not None
    if protocol == "grpc":
        try:
            # why: grpc is heavy and an optional extra ([grpc]); loaded only for protocol grpc
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError as e:  # an optional extra: Prometheus-only users need no grpcio
            raise GrpcExtraMissing(str(e)) from None

        kw: dict[str, Any] = {"timeout": timeout}
        if explicit:
            kw["endpoint"] = endpoint
        return OTLPSpanExporter(**kw), OTLPMetricExporter(**kw)
    # why: OTLP exporters load only with an endpoint
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetric
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpan

    if explicit:  # the HTTP exporters take a full URL per signal; the env var form is a base URL
        base = endpoint.rstrip("/")
        return (HttpSpan(endpoint=base + "/v1/traces", timeout=timeout),
                HttpMetric(endpoint=base + "/v1/metrics", timeout=timeout))
    return HttpSpan(timeout=timeout), HttpMetric(timeout=timeout)


class OtelExporter:
    """Owns (or borrows) the providers; registers instruments; turns operations into spans."""

    def __init__(self, cfg: OtelConfig, service_name: str, series: SeriesFn, on_error: ErrorFn, *,
                 meter_provider: Any = None, tracer_provider: Any = None,
                 environ: Mapping[str, str] | None = None) -> None:
        self.cfg = cfg
        self.instance_id = instance_id()
        self._series = series
        self._owned: list[Any] = []
        self.endpoint = None
        if (meter_provider is None or tracer_provider is None) and (ep := otlp_endpoint(cfg, environ)):
            try:
                mp_, tp_ = self._own_providers(cfg, service_name, ep, otlp_protocol(cfg, environ), on_error)
            except GrpcExtraMissing as e:
                # one clear line; metrics, spans on the global providers, /metrics all keep running
                log.warning("memprof_otel: OTLP over grpc to %s needs the grpc extra "
                            "(pip install 'memprof-otel[grpc]'): OTLP export is off (%s)", ep, e)
                on_error("otel_setup")
            else:
                self.endpoint = ep
                meter_provider = meter_provider or mp_
                tracer_provider = tracer_provider or tp_
        self.meter_provider = meter_provider or otel_metrics.get_meter_provider()
        self.tracer_provider = tracer_provider or otel_trace.get_tracer_provider()
        self.meter = self.meter_provider.get_meter(SCOPE, __version__)
        self.tracer = self.tracer_provider.get_tracer(SCOPE, __version__)
        self._instruments: list[Any] = []
        self._register()

    def _own_providers(self, cfg: OtelConfig, service_name: str, endpoint: str, protocol: str,
                       on_error: ErrorFn) -> tuple[Any, Any]:
        # why: our own SDK providers only when no provider is given
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        if service_name == "memprof-otel" and os.environ.get("OTEL_SERVICE_NAME"):
            service_name = os.environ["OTEL_SERVICE_NAME"]  # the standard variable beats our default
        resource = Resource.create({"service.name": service_name, "service.instance.id": self.instance_id,
                                    "service.version": __version__})
        span_exp, metric_exp = _otlp_exporters(cfg, endpoint, protocol)
        reader = PeriodicExportingMetricReader(
            _counting_metric_exporter(metric_exp, on_error, "otlp_metrics"),
            export_interval_millis=cfg.export_interval * 1000,
            export_timeout_millis=cfg.export_timeout * 1000)
        # shutdown_on_exit=False: the SDK's own atexit shutdown waits on the collector without a
        # bound; ours (runtime.shutdown) is bounded
        meter_provider = MeterProvider(metric_readers=[reader], resource=resource, shutdown_on_exit=False)
        tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        tracer_provider.add_span_processor(BatchSpanProcessor(
            _CountingSpanExporter(span_exp, on_error, "otlp_traces"),
            export_timeout_millis=cfg.export_timeout * 1000))
        self._owned = [meter_provider, tracer_provider]
        return meter_provider, tracer_provider

    # ---- metrics ---------------------------------------------------------------------------
    def _register(self) -> None:
        m = self.meter
        for d in METRICS:
            if d.kind in ("gauge", "info"):
                self._instruments.append(m.create_observable_gauge(
                    d.otel, callbacks=[self._callback(d.prom)], unit=d.unit, description=d.help))
            elif d.kind == "counter":
                self._instruments.append(m.create_observable_counter(
                    d.otel, callbacks=[self._callback(d.prom)], unit=d.unit, description=d.help))
        for name, unit, prom in _SEMCONV:
            self._instruments.append(m.create_observable_gauge(
                name, callbacks=[self._callback(prom)], unit=unit, description=f"same as {prom}"))
        by = {d.prom: d for d in METRICS}
        self.op_duration = self._histogram(by["memprof_operation_duration_seconds"], DURATION_BUCKETS)
        self.op_peak = self._histogram(by["memprof_operation_memory_peak_bytes"], MEMORY_PEAK_BUCKETS)
        self.op_peak_increase = self._histogram(by["memprof_operation_memory_peak_increase_bytes"],
                                                MEMORY_PEAK_BUCKETS)
        self.layer_forward = self._histogram(by["memprof_layer_forward_seconds"], DURATION_BUCKETS)

    def _histogram(self, d: MetricDef, bounds: Sequence[float]) -> Any:
        return self.meter.create_histogram(d.otel, unit=d.unit, description=d.help,
                                           explicit_bucket_boundaries_advisory=list(bounds))

    def _callback(self, prom: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def cb(options: CallbackOptions) -> Iterable[Observation]:
            try:
                return [Observation(v, dict(lab)) for lab, v in self._series().get(prom, ())]
            except Exception as e:  # a callback must never break the reader
                rate_limited.warning("otel-callback", "memprof_otel: OTel callback failed: %r", e)
                return []
        return cb

    def record_operation(self, rec: OperationRecord, label: str) -> None:
        attrs = {"operation": label}
        self.op_duration.record(rec.duration, attrs)
        self.op_peak.record(rec.peak_bytes, attrs)
        self.op_peak_increase.record(rec.peak_increase_bytes, attrs)

    def record_layer_calls(self, model: str, device: str, calls: Iterable[Any]) -> None:
        for c in calls:
            self.layer_forward.record(c.duration_s, {"model": model, "layer": c.path, "device": device})

    # ---- spans (the SpanHooks protocol of operations.py) ------------------------------------
    def start(self, rec: OperationRecord) -> Any:
        attrs = {k: _attr(v) for k, v in rec.attributes.items()}
        attrs["memprof.operation.kind"] = rec.kind
        if "model" in rec.attributes:
            attrs["memprof.model"] = str(rec.attributes["model"])
        span = self.tracer.start_span(rec.name, attributes=attrs)
        ctx = span.get_span_context()
        if ctx.is_valid:
            rec.trace_id = format(ctx.trace_id, "032x")
        return span

    def activate(self, span: Any) -> Any:
        return otel_context.attach(otel_trace.set_span_in_context(span))

    def deactivate(self, token: Any) -> None:
        otel_context.detach(token)

    def end(self, span: Any, rec: OperationRecord, exc: BaseException | None) -> None:
        span.set_attributes({
            "memprof.memory.peak_bytes": rec.peak_bytes,
            "memprof.memory.delta_bytes": rec.delta_bytes,
            "memprof.memory.rss_start_bytes": rec.rss_start,
            "memprof.memory.rss_end_bytes": rec.rss_end or 0,
            "memprof.memory.rss_peak_bytes": rec.rss_peak,
        })
        for dev, v in rec.device_peak.items():
            span.set_attribute(f"memprof.memory.{dev}.peak_bytes", v)
        if exc is not None:
            span.record_exception(exc)
            span.set_attribute("memprof.oom", rec.oom)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:256]))
        span.end()

    def span_event(self, name: str, attributes: Mapping[str, Any]) -> None:
        """An event on the current span if one is recording, else a short span of its own."""
        attrs = {k: _attr(v) for k, v in attributes.items()}
        cur = otel_trace.get_current_span()
        if cur.is_recording():
            cur.add_event(name, attrs)
            return
        with self.tracer.start_as_current_span(name, attributes=attrs) as span:
            span.add_event(name, attrs)

    # ---- lifecycle -------------------------------------------------------------------------
    def shutdown(self, timeout_s: float) -> bool:
        """Flush and stop the providers we own, within ``timeout_s``; True if they finished."""
        if not self._owned:
            return True
        owned, self._owned = self._owned, []

        def run() -> None:
            for p in owned:
                try:
                    p.shutdown()
                except Exception:
                    pass
        t = threading.Thread(target=run, name="memprof-otel-shutdown", daemon=True)
        t.start()
        t.join(timeout_s)
        return not t.is_alive()


def _attr(v: Any) -> Any:
    if isinstance(v, (str, bool, int, float)):
        return v
    return str(v)
