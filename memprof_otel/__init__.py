"""memprof_otel: always-on per-layer PyTorch memory telemetry for Prometheus and OpenTelemetry.

Importing starts no thread, sets no hook and writes no registry until you call us; its one side
effect is ``TF_CPU_ALLOCATOR_USE_BFC=true`` in the environment where it is unset (see below). It is also
cheap: the public names below are loaded on first use (PEP 562), so ``import memprof_otel`` and the
``memprof-otel`` command's HTTP subcommands never import torch, the OpenTelemetry SDK or matplotlib
(a command that only speaks HTTP starts in a tenth of a second, not in four).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .sources.tf_cpu_statistics import request_before_tensorflow

# The one thing importing does: where TF_CPU_ALLOCATOR_USE_BFC is unset, set it, so that a Keras
# model on TensorFlow has per-layer figures on every x86-64 CPU (TensorFlow keeps CPU allocator
# statistics only with its BFC allocator, by default only on CPUs with AVX-512/AMX, and reads the
# variable once, when it creates its CPU device). Nothing else about the process changes.
request_before_tensorflow()

# public name -> the module that defines it (relative to this package)
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(
        ("add_alert_callback", "asgi_app", "end_phase", "instrument", "mark_operation", "operation", "plot",
         "remove_alert_callback", "report", "serve", "shutdown", "start_monitoring", "stop_monitoring", "timeline",
         "wsgi_app"), ".api"),
    "LayerMemoryStats": ".attribution.stats",
    "Instrumentation": ".attribution.instrumentation",
    "Config": ".config", "load_config": ".config",
    "Capture": ".dumps.capture",
    **dict.fromkeys(
        ("AlreadyInstrumented", "CaptureBusy", "CaptureTimeout", "CaptureUnsupported", "ConfigError", "DumpNotFound", "ExportError",
         "InstrumentationError", "InvalidDumpId", "MemprofError", "ModelRequired", "ServeError",
         "ShapeError", "SourceUnavailable", "UnknownModel"), ".errors"),
    "Server": ".http.server",
    "current_operation": ".telemetry.operations",
    **dict.fromkeys(("OperationRecord", "Sample", "Timeline"), ".timeline"),
}

__all__ = sorted([*_EXPORTS, "__version__"])

# `timeline` names both a submodule and the public function. Importing a submodule the first time
# sets it as an attribute of this package, which would hide the function from __getattr__; import
# it now (it is light) and drop the attribute, so `memprof_otel.timeline` is always the function.
from . import timeline as _timeline_module  # noqa: E402

del timeline  # noqa: F821 - bound by the import system just above


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what type checkers and IDEs see: the same names, imported eagerly
    from .api import (add_alert_callback, asgi_app, end_phase, instrument, mark_operation, operation, plot,
                      remove_alert_callback, report, serve, shutdown, start_monitoring, stop_monitoring, timeline,
                      wsgi_app)
    from .attribution.stats import LayerMemoryStats
    from .attribution.instrumentation import Instrumentation
    from .config import Config, load_config
    from .dumps.capture import Capture
    from .errors import (AlreadyInstrumented, CaptureBusy, CaptureTimeout, CaptureUnsupported, ConfigError, DumpNotFound, ExportError,
                         InstrumentationError, InvalidDumpId, MemprofError, ModelRequired, ServeError,
                         ShapeError, SourceUnavailable, UnknownModel)
    from .http.server import Server
    from .telemetry.operations import current_operation
    from .timeline import OperationRecord, Sample, Timeline
