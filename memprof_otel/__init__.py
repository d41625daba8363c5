"""memprof_otel: always-on per-layer PyTorch memory telemetry for Prometheus and OpenTelemetry.

Importing has no side effects: no thread, no hook, no registry write until you call us.
"""
from __future__ import annotations

from ._version import __version__
from .api import (add_alert_callback, asgi_app, end_phase, instrument, mark_operation, operation, plot,
                  remove_alert_callback, report, serve, shutdown, start_monitoring, stop_monitoring, timeline,
                  wsgi_app)
from .attribution.stats import LayerMemoryStats
from .attribution.torch.instrumentation import Instrumentation
from .config import Config, load_config
from .dumps.capture import Capture
from .errors import (AlreadyInstrumented, CaptureBusy, CaptureTimeout, ConfigError, DumpNotFound, ExportError,
                     InstrumentationError, InvalidDumpId, MemprofError, ModelRequired, ServeError, SourceUnavailable,
                     UnknownModel)
from .http.server import Server
from .telemetry.operations import current_operation
from .timeline import OperationRecord, Sample, Timeline

__all__ = sorted([
    "AlreadyInstrumented", "Capture", "CaptureBusy", "CaptureTimeout", "Config", "ConfigError", "DumpNotFound",
    "ExportError", "Instrumentation", "Server", "InstrumentationError", "InvalidDumpId", "LayerMemoryStats", "MemprofError",
    "ModelRequired", "OperationRecord", "Sample", "ServeError", "SourceUnavailable", "Timeline", "UnknownModel", "__version__",
    "add_alert_callback", "current_operation", "end_phase", "instrument", "load_config", "mark_operation",
    "operation", "plot", "remove_alert_callback", "report", "serve", "shutdown", "start_monitoring", "stop_monitoring",
    "timeline", "wsgi_app", "asgi_app",
])
