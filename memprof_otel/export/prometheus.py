"""The Prometheus collector: renders the runtime's latest snapshot at scrape time.

A scrape builds families from the ``series()`` it is given (the last sampler tick plus in-memory
stats) and never reads a device, triggers a CUDA sync or starts a capture. The process's constant
labels (``rank`` in a rank of a distributed job: ``telemetry/ranks.py``) go on every sample. Registered in a registry of our own,
never the global one, so importing us changes nothing in an application's own /metrics.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator, Protocol

from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily,
                                    InfoMetricFamily, Metric, SummaryMetricFamily)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.samples import Exemplar

from prometheus_client.exposition import choose_encoder

from .._log import rate_limited
from ..config import Config
from ..metric_names import BY_PROM, METRICS, MetricDef
from ..telemetry.operation_stats import OperationStats
from ..telemetry.ranks import process_labels
from ..telemetry.series import LayerView, Series, layer_forward_series
from .fleet_families import FLEET_BUCKETS, LEFT_OUT, ZEROS_LEFT_OUT, serves_fleet_set
from .layer_exposition import LAYER_FAMILIES, render_layer_families


class ScrapeSource(Protocol):
    """What a scrape reads (the process runtime is one): layer views, the series, operation stats."""

    op_stats: OperationStats
    config: Config | None

    def exports_every_layer(self) -> bool: ...
    def layer_views(self) -> list[LayerView]: ...
    def exported_layer_views(self, views: list[LayerView] | None = None) -> list[LayerView]: ...
    def record_series_exported(self, n: int) -> None: ...
    def series(self, max_age_s: float = 0.25, views: list[LayerView] | None = None,
               per_layer: bool = True) -> Series: ...
    def count_export_error(self, exporter: str) -> None: ...


class MemprofCollector(Collector):
    """``layers=False`` leaves out the per-layer families: the endpoint writes those itself
    (``layer_exposition``), much faster; a collector registered elsewhere keeps them. ``labels``:
    constant labels on every sample (default: the process's, ``process_labels()``)."""

    def __init__(self, rt: ScrapeSource, layers: bool = True, labels: Mapping[str, str] | None = None) -> None:
        self._rt = rt
        self._layers = layers
        self.labels: dict[str, str] = dict(process_labels() if labels is None else labels)

    def describe(self) -> list[Metric]:
        return []  # families vary with what runs; skip describe-time collection

    def collect(self) -> Iterator[Metric]:
        rt = self._rt
        try:
            views = rt.layer_views()  # one snapshot for the gauges and the summary (was taken twice)
            series = rt.series(max_age_s=0.0, views=views, per_layer=self._layers)
            views = rt.exported_layer_views(views)  # the summary's layers: those of the series budget
            ops = rt.op_stats.snapshot()
            fleet = serves_fleet_set(rt.config.series.families if rt.config is not None else "auto",
                                     rt.exports_every_layer())
        except Exception as e:  # a scrape never fails because of us
            rt.count_export_error("prometheus")
            rate_limited.warning("scrape", "memprof_otel: building the scrape failed: %r", e)
            return
        for d in METRICS:
            if not self._layers and d.prom in LAYER_FAMILIES:
                continue
            if fleet and d.prom in LEFT_OUT:
                continue
            const = self.labels
            if d.kind == "summary":
                fam = SummaryMetricFamily(d.prom, d.help, labels=[*const, *d.labels], unit=d.prom_unit)
                for labels, seconds, calls in layer_forward_series(views):
                    fam.add_metric([*const.values(), *(labels[k] for k in d.labels)], count_value=calls,
                                   sum_value=seconds)
                yield fam
            elif d.kind == "histogram":
                yield self._histogram(d, ops, const, FLEET_BUCKETS[d.prom][1] if fleet and d.prom in FLEET_BUCKETS else None)
            else:
                rows = series.get(d.prom, ())
                if fleet and d.prom in ZEROS_LEFT_OUT:
                    rows = [row for row in rows if row[1]]
                yield _family(d, rows, const)

    @staticmethod
    def _histogram(d: MetricDef, ops: dict[str, Any], const: Mapping[str, str],
                   bounds: tuple[float, ...] | None = None) -> Metric:
        """``bounds``: a subset of the histogram's own to serve (the fleet set); None: all."""
        fam = HistogramMetricFamily(d.prom, d.help, labels=[*const, *d.labels], unit=d.prom_unit)
        for name, f in sorted(ops.items()):
            h = {"memprof_operation_duration_seconds": f.duration,
                 "memprof_operation_memory_peak_increase_bytes": f.peak_increase}.get(d.prom, f.peak)
            if bounds is not None:
                h = h.coarse(bounds)
            buckets = [(le, count, Exemplar({"trace_id": ex[0]}, ex[1], ex[2]) if ex else None)
                       for le, count, ex in h.cumulative()]
            fam.add_metric([*const.values(), name], buckets, sum_value=h.sum)
        return fam


def _family(d: MetricDef, rows: Any, const: Mapping[str, str]) -> Metric:
    labels = list(d.labels)
    if d.kind == "counter":
        fam: Any = CounterMetricFamily(d.prom, d.help, labels=[*const, *labels], unit=d.prom_unit)
    elif d.kind == "info":
        fam = InfoMetricFamily(d.family, d.help, labels=[])
        for lab, _ in rows:
            fam.add_metric([], {**const, **{k: str(lab.get(k, "")) for k in d.labels}})
        return fam
    else:
        fam = GaugeMetricFamily(d.prom, d.help, labels=[*const, *labels], unit=d.prom_unit)
    for lab, value in rows:
        fam.add_metric([*const.values(), *(str(lab.get(k, "")) for k in labels)], value)
    return fam


def make_registry(rt: ScrapeSource, layers: bool = True, labels: Mapping[str, str] | None = None) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(MemprofCollector(rt, layers, labels))
    return reg


def render_exposition(rt: ScrapeSource, registry: CollectorRegistry, accept: str = "",
                      labels: Mapping[str, str] | None = None) -> tuple[bytes, str]:
    """(body, content type) for ``accept``: ``registry`` (made with ``layers=False``) through
    prometheus_client's encoder, plus the per-layer families through the fast writer, with the
    constant ``labels`` (default: the process's, as the registry's collector has them). OpenMetrics
    carries ``# UNIT`` lines for every family whose name ends in its unit.
    (``prometheus.enabled: false`` is the endpoint's to answer: it never calls this then.)"""
    encoder, content_type = choose_encoder(accept)
    body = encoder(registry)
    try:
        openmetrics = content_type.startswith("application/openmetrics-text")
        const = process_labels() if labels is None else labels
        layers = render_layer_families(rt.exported_layer_views(), openmetrics, const).encode()
    except Exception as e:  # a scrape never fails because of us: serve the rest
        rt.count_export_error("prometheus")
        rate_limited.warning("scrape-layers", "memprof_otel: rendering layer families failed: %r", e)
        layers = b""
    eof = b"# EOF\n"
    if body.endswith(eof):  # OpenMetrics: the terminator stays last
        body = body[: -len(eof)] + layers + eof
    else:
        body += layers
    return body, content_type


def count_samples(body: bytes) -> int:
    """Samples in an exposition: its lines less the comment lines (HELP, TYPE, UNIT, EOF). What
    ``memprof_series_exported`` reports of the last ``/metrics`` answer (the endpoint counts the
    body it answers: in single-port mode that holds every worker's series, while the renders of
    this process's part alone, for the answer and for its snapshot file, are not answers)."""
    return body.count(b"\n") - body.count(b"\n#") - body.startswith(b"#")


__all__ = ["BY_PROM", "MemprofCollector", "count_samples", "make_registry", "render_exposition"]
