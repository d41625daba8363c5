"""Our own OTLP pipeline: SDK providers, OTLP exporters (HTTP or gRPC) and the resource, built
from resolved ``OtelSettings`` (explicit config > ``OTEL_*`` environment > defaults).

Exports run on the SDK's background threads, so a slow or dead collector never blocks a forward.
Each exporter is wrapped: a failed or raising export is counted (``on_error(name)``, which feeds
``memprof_export_errors_total{exporter}``), never raised, and logged at a bounded rate
(``export_failures``) instead of once per export.
"""
from __future__ import annotations

import os
import socket
import uuid
from typing import Any, Callable, NamedTuple

from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.trace import NoOpTracerProvider

from .._version import __version__
from ..telemetry.ranks import ranks_from
from .bounded_shutdown import Abort, Step
from .export_failures import ExportFailureLog, install_sdk_log_filter, quiet_sdk_logs
from .otel_settings import OtelSettings, resource_attributes

ErrorFn = Callable[[str], None]


def instance_id() -> str:
    """Unique per worker process: host, pid and a random part (pids repeat across restarts)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class GrpcExtraMissing(ImportError):
    """OTLP over gRPC was asked for but the ``[grpc]`` extra is not installed."""


class _CountingSpanExporter:
    """Wraps a span exporter: a failed or raising export is counted, never raised. In a forked
    child it exports nothing: what it holds is the parent's, under the parent's service.instance.id
    (the parent sends it; the runtime builds the child an exporter of its own)."""

    def __init__(self, inner: Any, on_error: ErrorFn, name: str, target: str, failures: ExportFailureLog) -> None:
        self._inner, self._on_error, self._name, self._target = inner, on_error, name, target
        self._failures = failures
        self._pid = os.getpid()

    def export(self, spans: Any) -> Any:
        # why: the OTel SDK loads only once we export through it
        from opentelemetry.sdk.trace.export import SpanExportResult

        if os.getpid() != self._pid:
            return SpanExportResult.SUCCESS
        with quiet_sdk_logs() as captured:
            try:
                result = self._inner.export(spans)
            except Exception as e:
                captured.reason = captured.reason or repr(e)
                result = SpanExportResult.FAILURE
        _outcome(result == SpanExportResult.SUCCESS, self._name, self._target, captured.reason, self._on_error,
                 self._failures)
        return result

    def shutdown(self) -> None:
        try:
            with quiet_sdk_logs():
                self._inner.shutdown()
        except Exception:
            pass

    abort = shutdown  # at a shutdown's deadline: no retry after it (bounded_shutdown.py)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        try:
            return bool(self._inner.force_flush(timeout_millis))
        except Exception:
            return False


def _outcome(ok: bool, name: str, target: str, reason: str, on_error: ErrorFn,
             failures: ExportFailureLog) -> None:
    if ok:
        failures.succeeded(name, target)
    else:
        on_error(name)
        failures.failed(name, target, reason)


def _counting_metric_exporter(inner: Any, on_error: ErrorFn, name: str, target: str,
                              failures: ExportFailureLog) -> Any:
    # why: the OTel SDK loads only once we export through it
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

    pid = os.getpid()

    class CountingMetricExporter(MetricExporter):
        def __init__(self) -> None:
            super().__init__(preferred_temporality=getattr(inner, "_preferred_temporality", None),
                             preferred_aggregation=getattr(inner, "_preferred_aggregation", None))

        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
            if os.getpid() != pid:  # a forked child: the parent's instance, as for spans above
                return MetricExportResult.SUCCESS
            with quiet_sdk_logs() as captured:
                try:
                    result = inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
                except Exception as e:
                    captured.reason = captured.reason or repr(e)
                    result = MetricExportResult.FAILURE
            _outcome(result == MetricExportResult.SUCCESS, name, target, captured.reason, on_error, failures)
            return result

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            try:
                return bool(inner.force_flush(timeout_millis=timeout_millis))
            except Exception:
                return False

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            try:
                with quiet_sdk_logs():
                    inner.shutdown(timeout_millis=timeout_millis)
            except Exception:
                pass

        def abort(self) -> None:  # at a shutdown's deadline: no retry after it (bounded_shutdown.py)
            self.shutdown(timeout_millis=0)

    return CountingMetricExporter()


def _otlp_exporters(s: OtelSettings) -> tuple[Any, Any, str, str]:
    """(span exporter or None, metric exporter or None, traces target, metrics target)."""
    assert s.endpoint is not None
    if s.protocol == "grpc":
        try:
            # why: grpc is heavy and an optional extra ([grpc]); loaded only for protocol grpc
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError as e:  # an optional extra: Prometheus-only users need no grpcio
            raise GrpcExtraMissing(str(e)) from None
        ep = {"endpoint": s.endpoint} if s.endpoint_explicit else {}
        spans = OTLPSpanExporter(timeout=s.traces_timeout_s, **ep) if s.traces else None
        metrics = OTLPMetricExporter(timeout=s.metrics_timeout_s, **ep) if s.metrics else None
        return spans, metrics, s.endpoint, s.endpoint
    # why: OTLP exporters load only with an endpoint
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetric
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpan

    if s.endpoint_explicit:  # the HTTP exporters take a full URL per signal; otel.endpoint is a base URL
        base = s.endpoint.rstrip("/")
        t_url, m_url = base + "/v1/traces", base + "/v1/metrics"
        spans = HttpSpan(endpoint=t_url, timeout=s.traces_timeout_s) if s.traces else None
        metrics = HttpMetric(endpoint=m_url, timeout=s.metrics_timeout_s) if s.metrics else None
    else:  # the SDK reads the OTEL_EXPORTER_OTLP_[SIGNAL_]ENDPOINT variables itself
        spans = HttpSpan(timeout=s.traces_timeout_s) if s.traces else None
        metrics = HttpMetric(timeout=s.metrics_timeout_s) if s.metrics else None
        t_url = getattr(spans, "_endpoint", s.endpoint)
        m_url = getattr(metrics, "_endpoint", s.endpoint)
    return spans, metrics, t_url, m_url


def build_resource(explicit_service_name: str | None, instance: str) -> Any:
    """The resource: the SDK's (its defaults and detectors) < ours (``service.name=memprof-otel``,
    a worker-unique ``service.instance.id``, ``service.version``, a rank's ``torch.distributed.*``) < what the environment says
    (``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME``, read by the SDK's own detector) < an
    explicit ``service_name``."""
    # why: the SDK loads only for a pipeline of our own
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource

    from_env = OTELResourceDetector().detect().attributes
    ours = Resource(resource_attributes(explicit_service_name, instance, __version__, from_env,
                                        ranks_from().resource_attributes()))
    return Resource.create().merge(ours)


class OwnProviders(NamedTuple):
    """Our pipeline: SDK providers exporting over OTLP, or no-op ones for a signal that is off, and
    how to shut the SDK ones down within a deadline (``bounded_shutdown.shutdown_within``)."""

    meter_provider: Any
    tracer_provider: Any
    steps: tuple[Step, ...]    # each SDK provider's shutdown, given the seconds left
    aborts: tuple[Abort, ...]  # each exporter's: no retry after it


def own_providers(s: OtelSettings, instance: str, on_error: ErrorFn,
                  failures: ExportFailureLog) -> OwnProviders:
    """SDK providers exporting over OTLP, or no-op ones for a signal that is off
    (``OTEL_<SIGNAL>_EXPORTER=none``, ``otel.metrics``/``otel.traces: false``).
    ``failures``: where failed exports are reported (at a bounded rate)."""
    # why: our own SDK providers only when no provider is given
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    span_exp, metric_exp, t_url, m_url = _otlp_exporters(s)
    install_sdk_log_filter()  # the exporter modules (and their loggers) exist now
    resource = build_resource(s.service_name, instance)
    meter_provider: Any = NoOpMeterProvider()
    tracer_provider: Any = NoOpTracerProvider()
    steps: list[Step] = []
    aborts: list[Abort] = []
    # shutdown_on_exit=False: the SDK's own atexit shutdown waits on the collector without a
    # bound; ours (runtime.shutdown) is bounded
    if metric_exp is not None:
        counting = _counting_metric_exporter(metric_exp, on_error, "otlp_metrics", m_url, failures)
        reader = PeriodicExportingMetricReader(counting, export_interval_millis=s.export_interval_s * 1000,
                                               export_timeout_millis=s.metrics_timeout_s * 1000)
        meter_provider = MeterProvider(metric_readers=[reader], resource=resource, shutdown_on_exit=False)
        steps.append(lambda left_s: meter_provider.shutdown(timeout_millis=left_s * 1000))
        aborts.append(counting.abort)
    if span_exp is not None:
        spans = _CountingSpanExporter(span_exp, on_error, "otlp_traces", t_url, failures)
        tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        tracer_provider.add_span_processor(BatchSpanProcessor(spans, export_timeout_millis=s.traces_timeout_s * 1000))
        steps.append(lambda left_s: tracer_provider.shutdown())  # the SDK's span processor takes no deadline
        aborts.append(spans.abort)
    return OwnProviders(meter_provider, tracer_provider, tuple(steps), tuple(aborts))
