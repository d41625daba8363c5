"""memprof_otel: always-on per-layer PyTorch memory telemetry for Prometheus and OpenTelemetry.

Importing has no side effects: no thread, no hook, no registry write until you call us.
"""
from __future__ import annotations

from ._version import __version__
from .attribution.stats import LayerMemoryStats
from .capture import Capture
from .config import Config, load_config
from .errors import (AlreadyInstrumented, CaptureBusy, CaptureTimeout, ConfigError, InstrumentationError,
                     MemprofError, SourceUnavailable)
from .instrumentation import Instrumentation, instrument
from .timeline_export import ExportError

__all__ = sorted([
    "AlreadyInstrumented", "Capture", "CaptureBusy", "CaptureTimeout", "Config", "ConfigError", "ExportError",
    "Instrumentation", "InstrumentationError", "LayerMemoryStats", "MemprofError", "SourceUnavailable",
    "__version__", "instrument", "load_config",
])
