"""Exporters: the Prometheus collector and layer exposition, OpenTelemetry metrics and spans. The only
package that imports ``prometheus_client`` and ``opentelemetry``.

``bounded_shutdown.py`` our OTLP providers shut down within a deadline, whatever the collector does
``export_failures.py`` what a dead collector may log: one line when exports fail, then a bounded rate
``exposition_merge.py`` several processes' expositions as one, a ``worker`` label on every sample (pure)
``fleet_families.py`` what a pod of a fleet serves on ``/metrics`` besides its top layers (pure)
``layer_exposition.py`` the per-layer families written straight to exposition text
``otel.py`` the catalog's metrics as OpenTelemetry instruments, and spans per operation
``otel_observer.py`` the forward observer: the layer-forward histogram, per-layer capture spans
``otel_pipeline.py`` our own OTLP pipeline: SDK providers, exporters (HTTP or gRPC), the resource
``otel_settings.py`` what that pipeline uses: config > ``OTEL_*`` environment > defaults, resolved once
``process_semconv.py`` the semantic-convention ``process.*`` metrics, published next to ours
``prometheus.py`` the Prometheus collector: the latest snapshot rendered at scrape time
``span_attributes.py`` the span attribute keys (fixed strings; devices are values)
``worker_snapshots.py`` the single-port mode's files: each worker's exposition in a shared folder

Public: what ``GET /metrics`` serves and the OpenTelemetry instruments, spans, events and resource
(docs/reference.md, Prometheus metrics and OpenTelemetry), and the ``prometheus.*``, ``otel.*``,
``series.*`` and ``workers.*`` config. The module paths are internal.
"""
