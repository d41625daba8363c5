"""Exporters: the Prometheus collector and layer exposition, OpenTelemetry metrics and spans."""
