"""memprof_otel: always-on per-layer PyTorch memory telemetry for Prometheus and OpenTelemetry.

Importing has no side effects: no thread, no hook, no registry write until you call us.
"""
from __future__ import annotations

from ._version import __version__
from .api import end_phase, mark_operation, plot, report, shutdown, start_monitoring, stop_monitoring, timeline
from .attribution.stats import LayerMemoryStats
from .dumps.capture import Capture
from .config import Config, load_config
from .http.server import Server, asgi_app, serve, wsgi_app
from .errors import (AlreadyInstrumented, CaptureBusy, CaptureTimeout, ConfigError, DumpNotFound,
                     InstrumentationError, InvalidDumpId, MemprofError, ServeError, SourceUnavailable, UnknownModel)
from .attribution.torch.instrumentation import Instrumentation, instrument
from .telemetry.operations import current_operation, operation
from .timeline import OperationRecord, Sample, Timeline
from .reports.timeline_export import ExportError
from .watchdog.adapter import add_alert_callback, remove_alert_callback

__all__ = sorted([
    "AlreadyInstrumented", "Capture", "CaptureBusy", "CaptureTimeout", "Config", "ConfigError", "DumpNotFound",
    "ExportError", "Instrumentation", "Server", "InstrumentationError", "InvalidDumpId", "LayerMemoryStats", "MemprofError",
    "OperationRecord", "Sample", "ServeError", "SourceUnavailable", "Timeline", "UnknownModel", "__version__",
    "add_alert_callback", "current_operation", "end_phase", "instrument", "load_config", "mark_operation",
    "operation", "plot", "remove_alert_callback", "report", "serve", "shutdown", "start_monitoring", "stop_monitoring",
    "timeline", "wsgi_app", "asgi_app",
])
