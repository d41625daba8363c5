"""OpenTelemetry: the catalog's metrics as instruments, spans per operation.

Providers, in order: the ones the application injects; else our own SDK providers exporting over
OTLP when an endpoint is configured (``otel.endpoint`` or the standard ``OTEL_EXPORTER_OTLP_*``
variables; see ``otel_pipeline``); else the global API providers (a no-op unless the application
set an SDK). Configuration precedence: explicit memprof config > ``OTEL_*`` environment > our
defaults (``otel_settings``). In a rank of a distributed job every data point carries the
``rank`` attribute, as the Prometheus series carry the label, and the resource (of our own pipeline)
the ``torch.distributed.*`` attributes (``telemetry/ranks.py``).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
from typing import Any, Callable, Iterable, Mapping, Sequence

from opentelemetry import context as otel_context
from opentelemetry import metrics as otel_metrics
from opentelemetry import trace as otel_trace
from opentelemetry.metrics import CallbackOptions, NoOpMeterProvider, Observation
from opentelemetry.trace import NoOpTracerProvider, Status, StatusCode

from .._log import rate_limited
from .._version import __version__
from ..config import OtelConfig
from ..errors import ConfigError
from ..metric_names import DURATION_BUCKETS, LAYER_DURATION_BUCKETS, MEMORY_PEAK_BUCKETS, METRICS, MetricDef
from ..telemetry.ranks import process_labels
from ..timeline import OperationRecord
from . import process_semconv as semconv
from .export_failures import ExportFailureLog
from .bounded_shutdown import shutdown_within
from .otel_pipeline import GrpcExtraMissing, OwnProviders, instance_id, own_providers
from .otel_settings import resolve
from .span_attributes import device_peak_attributes

log = logging.getLogger("memprof_otel.otel")

SeriesFn = Callable[[], Mapping[str, Sequence[tuple[Mapping[str, str], float]]]]
Rows = Sequence[tuple[Mapping[str, str], float]]
ErrorFn = Callable[[str], None]
SCOPE = "memprof_otel"
# the per-model metrics (a ``model`` label): what an uninstrumented model leaves for the next export
PER_MODEL = frozenset(d.prom for d in METRICS if "model" in d.labels and d.kind in ("gauge", "counter"))
MAX_RETIRED_MODELS = 64

__all__ = ["GrpcExtraMissing", "OtelExporter", "instance_id"]


class OtelExporter:
    """Owns (or borrows) the providers; registers instruments; turns operations into spans.

    ``ignored_env``: the ``OTEL_*`` values that were refused (the default kept) for the caller to
    log and count. ``endpoint``: where our own pipeline exports, None when we own none.
    ``failures``: the bounded-rate report of our failed exports.
    """

    def __init__(self, cfg: OtelConfig, service_name: str | None, series: SeriesFn, on_error: ErrorFn, *,
                 meter_provider: Any = None, tracer_provider: Any = None,
                 environ: Mapping[str, str] | None = None) -> None:
        self.cfg = cfg
        self.instance_id = instance_id()
        self._series = series
        # the process's constant attributes (rank), on every data point
        self.constant: dict[str, str] = process_labels(os.environ if environ is None else environ)
        self._owned: OwnProviders | None = None
        self.endpoint: str | None = None
        settings = resolve(cfg, service_name, os.environ if environ is None else environ)
        self.settings = settings
        self.ignored_env: tuple[ConfigError, ...] = settings.ignored
        self.failures = ExportFailureLog()  # this pipeline's failed exports, logged at a bounded rate
        ep = settings.endpoint
        # our pipeline carries only the signals the application did not give a provider for
        wanted = dataclasses.replace(settings, metrics=settings.metrics and meter_provider is None,
                                     traces=settings.traces and tracer_provider is None)
        if ep and (wanted.metrics or wanted.traces):
            try:
                own = own_providers(wanted, self.instance_id, on_error, self.failures)
                mp_, tp_ = own.meter_provider, own.tracer_provider
            except GrpcExtraMissing as e:
                # one clear line; metrics, spans on the global providers, /metrics all keep running
                log.warning("memprof_otel: OTLP over grpc to %s needs the grpc extra "
                            "(pip install 'memprof-otel[grpc]'): OTLP export is off (%s)", ep, e)
                on_error("otel_setup")
            else:
                self.endpoint = ep
                self._owned = own  # the SDK providers, shut down with the exporter
                meter_provider = meter_provider or mp_
                tracer_provider = tracer_provider or tp_
        if ep and self.endpoint is None and not (wanted.metrics or wanted.traces):
            # both signals off (OTEL_SDK_DISABLED=true, say): off, not the global providers
            meter_provider = meter_provider or NoOpMeterProvider()
            tracer_provider = tracer_provider or NoOpTracerProvider()
        self.meter_provider = meter_provider or otel_metrics.get_meter_provider()
        self.tracer_provider = tracer_provider or otel_trace.get_tracer_provider()
        self.meter = self.meter_provider.get_meter(SCOPE, __version__)
        self.tracer = self.tracer_provider.get_tracer(SCOPE, __version__)
        self._instruments: list[Any] = []
        self._retired: dict[str, dict[str, list[tuple[Mapping[str, str], float]]]] = {}
        self._retired_lock = threading.Lock()
        self._process = semconv.ProcessCounters()
        self._register()

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
        make = {"gauge": m.create_observable_gauge, "counter": m.create_observable_counter,
                "updowncounter": m.create_observable_up_down_counter}
        for name, kind, unit, prom, help_ in semconv.FROM_SERIES:
            self._instruments.append(make[kind](name, callbacks=[self._callback(prom)], unit=unit,
                                                description=help_))
        for (name, kind, unit, help_), read in ((semconv.CPU_TIME, self._process.cpu_time),
                                                (semconv.DISK_IO, self._process.disk_io)):
            self._instruments.append(make[kind](name, callbacks=[_observe(read, self.constant)], unit=unit,
                                                description=help_))
        by = {d.prom: d for d in METRICS}
        self.op_duration = self._histogram(by["memprof_operation_duration_seconds"], DURATION_BUCKETS)
        self.op_peak = self._histogram(by["memprof_operation_memory_peak_bytes"], MEMORY_PEAK_BUCKETS)
        self.op_peak_increase = self._histogram(by["memprof_operation_memory_peak_increase_bytes"],
                                                MEMORY_PEAK_BUCKETS)
        self.layer_forward = (self._histogram(by["memprof_layer_forward_seconds"], LAYER_DURATION_BUCKETS)
                              if self.cfg.layer_histogram else None)

    def _histogram(self, d: MetricDef, bounds: Sequence[float]) -> Any:
        return self.meter.create_histogram(d.otel, unit=d.unit, description=d.help,
                                           explicit_bucket_boundaries_advisory=list(bounds))

    def _callback(self, prom: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        retires = prom in PER_MODEL

        def rows() -> Rows:
            live = list(self._series().get(prom, ()))
            return live + self._take_retired(prom, live) if retires else live
        return _observe(rows, self.constant)

    def retire(self, series: Mapping[str, Rows]) -> None:
        """An uninstrumented model's last per-model figures (``series``: Prometheus name ->
        rows): each is observed once more, in the next collection (the final one at shutdown
        included), then dropped, so a short job that uninstruments before it shuts down still
        exports its layers. Kept per model name (a model retired twice keeps its last figures),
        for at most ``MAX_RETIRED_MODELS`` models: where no collection ever runs (a no-op
        provider) they must not pile up."""
        with self._retired_lock:
            for prom, rows in series.items():
                if prom not in PER_MODEL or not rows:
                    continue
                per_model = self._retired.setdefault(prom, {})
                fresh: dict[str, list[tuple[Mapping[str, str], float]]] = {}
                for lab, v in rows:
                    fresh.setdefault(lab.get("model", ""), []).append((dict(lab), v))
                for model, model_rows in fresh.items():
                    per_model.pop(model, None)  # re-inserted last: the oldest go first
                    per_model[model] = model_rows
                while len(per_model) > MAX_RETIRED_MODELS:
                    del per_model[next(iter(per_model))]

    def _take_retired(self, prom: str, live: Rows) -> list[tuple[Mapping[str, str], float]]:
        with self._retired_lock:
            per_model = self._retired.pop(prom, None)
        if not per_model:
            return []
        seen = {tuple(sorted(lab.items())) for lab, _ in live}  # re-instrumented under the same name
        return [(lab, v) for rows in per_model.values() for lab, v in rows
                if tuple(sorted(lab.items())) not in seen]

    def record_operation(self, rec: OperationRecord, label: str) -> None:
        attrs = {**self.constant, "operation": label}
        self.op_duration.record(rec.duration, attrs)
        self.op_peak.record(rec.peak_bytes, attrs)
        self.op_peak_increase.record(rec.peak_increase_bytes, attrs)

    def record_layer_calls(self, model: str, device: str, calls: Iterable[Any]) -> None:
        hist = self.layer_forward
        if hist is None:  # otel.layer_histogram: false
            return
        for c in calls:
            hist.record(c.duration_s, {**self.constant, "model": model, "layer": c.path, "device": device})

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
        span.set_attributes(device_peak_attributes(rec.device_peak))
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
        """Flush and stop the providers we own within ``timeout_s``, whatever the collector does
        (``bounded_shutdown``); True if they finished."""
        owned, self._owned = self._owned, None
        if owned is None:
            return True
        return shutdown_within(owned.steps, owned.aborts, timeout_s)


def _attr(v: Any) -> Any:
    if isinstance(v, (str, bool, int, float)):
        return v
    return str(v)


def _observe(read: Callable[[], Rows], constant: Mapping[str, str]) -> Callable[[CallbackOptions],
                                                                              Iterable[Observation]]:
    def cb(options: CallbackOptions) -> Iterable[Observation]:
        try:
            return [Observation(v, {**constant, **lab}) for lab, v in read()]
        except Exception as e:  # a callback must never break the reader
            rate_limited.warning("otel-callback", "memprof_otel: OTel callback failed: %r", e)
            return []
    return cb
