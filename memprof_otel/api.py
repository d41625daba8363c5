"""The module-level functions of the public API (``mp.operation``, ``mp.report``, ...)."""
from __future__ import annotations

import os
from typing import Any

from .reports import plot as _plot_module  # noqa: F401  load before mp.plot is bound: a lazy
from .reports import text as _report_module  # noqa: F401  submodule import would replace the function
from .config import Config
from .telemetry.operations import operation
from .runtime import runtime
from .timeline import OperationRecord, Timeline


def start_monitoring(config: Any = None, *, meter_provider: Any = None, tracer_provider: Any = None) -> None:
    """Start (or restart with this config) the background sampler and exporters; no model needed.
    ``meter_provider``/``tracer_provider``: OTel SDK providers to use instead of our own."""
    runtime().start_monitoring(config, meter_provider=meter_provider, tracer_provider=tracer_provider)


def stop_monitoring(timeout: float = 2.0) -> bool:
    """Stop the sampler (joined within ``timeout``); instrumented models keep their hooks."""
    return runtime().stop_monitoring(timeout)


def shutdown(timeout: float = 5.0) -> bool:
    """Flush exporters, stop the sampler and servers, within ``timeout`` seconds (also at exit)."""
    return runtime().shutdown(timeout)


def mark_operation(name: str, **attributes: Any) -> OperationRecord:
    """Start a process-wide phase named ``name``; the previous phase ends here."""
    if not isinstance(name, str) or not name:
        from .errors import MemprofError

        raise MemprofError(f"operation name must be a non-empty string, got {name!r}")
    return runtime().operations_tracker().mark(name, dict(attributes))


def end_phase() -> None:
    """End the current ``mark_operation`` phase without starting another."""
    runtime().tracker.end_phase()


def timeline(since: float | None = None) -> Timeline:
    """Synchronized arrays (timestamps, RSS, CPU, I/O, allocator bytes per device) + operations.
    ``since``: seconds back from now (None = everything in the ring buffer)."""
    import time

    rt = runtime()
    since_unix = None if since is None else time.time() - since
    samples = rt.sampler.samples(since_unix) if rt.sampler is not None else []
    return Timeline.from_samples(samples, rt.tracker.records(since_unix))


def report() -> str:
    """The operations report: peak RSS, when, during which operation; a numbered timeline."""
    from .reports.text import format_report

    rt = runtime()
    samples = rt.sampler.samples() if rt.sampler is not None else []
    return format_report(samples, rt.tracker.records())


def plot(path: str | os.PathLike[str]) -> None:
    """Write the 4-panel PNG (memory with phases, CPU, disk I/O per phase, durations)."""
    from .reports.plot import plot_timeline

    plot_timeline(timeline(), path)


__all__ = ["Config", "end_phase", "mark_operation", "operation", "plot", "report", "shutdown",
           "start_monitoring", "stop_monitoring", "timeline"]
