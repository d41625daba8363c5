"""The forward observer that feeds OpenTelemetry: the layer-forward histogram from attributed
forwards, and per-layer spans from a completed deep capture.

Registered on every handle by the composition root; an uninstrumented handle's last per-layer
figures go to the exporter, for its next (or final) export. The exporter is looked up per event (a
restart may replace it, or turn OpenTelemetry off). Nothing here raises into a forward: a failure
to build the spans is counted in ``memprof_export_errors_total{exporter="capture_spans"}``.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from opentelemetry import trace as otel_trace

from .._log import rate_limited
from ..dumps.speedscope import balanced_calls
from ..telemetry.series_budget import Keep, restrict_view
from ..telemetry.series import LayerView, SelfView, build_series
from .otel import OtelExporter


class OtelForwardObserver:
    """``layer_view(h)``: the handle's figures as the series read them (the composition root's);
    ``exported_layers(model)``: ``{model: paths}`` of the layers its series budget exports, or None
    for every layer (``telemetry/series_budget.py``)."""

    def __init__(self, exporter: Callable[[], OtelExporter | None],
                 count_export_error: Callable[[str], None],
                 layer_view: Callable[[Any], LayerView] | None = None,
                 exported_layers: Callable[[str], Keep | None] | None = None) -> None:
        self._exporter = exporter
        self._count_error = count_export_error
        self._layer_view = layer_view
        self._exported = exported_layers

    def _keep(self, model: str) -> frozenset[str] | None:
        keep = self._exported(model) if self._exported is not None else None
        return keep.get(model) if keep is not None else None

    def forward_begin(self, h: Any, state: Any) -> None:
        return None

    def forward_done(self, h: Any, state: Any, raised: bool, exc: BaseException | None) -> None:
        if state is None:  # most forwards are not attributed: nothing to record
            return
        otel = self._exporter()
        if otel is not None:
            keep = self._keep(h.name)
            calls = state.calls if keep is None else [c for c in state.calls if c[0] in keep]
            otel.record_layer_calls(h.name, h.last_device, calls)

    def uninstrumented(self, h: Any) -> None:
        """Hand the model's final per-layer figures to the next export (the final one included)."""
        otel = self._exporter()
        if otel is None or self._layer_view is None:
            return
        try:
            view, keep = self._layer_view(h), self._keep(h.name)
            otel.retire(build_series(None, [view if keep is None else restrict_view(view, keep)], SelfView()))
        except Exception as e:
            self._count_error("otel_retire")
            rate_limited.warning("otel-retire", "memprof_otel: final layer figures of %r not kept: %r", h.name, e)

    def capture_done(self, h: Any, cap: Any) -> None:
        otel = self._exporter()
        if otel is None:
            return
        try:
            emit_capture_spans(otel, h.name, cap)
        except Exception as e:
            self._count_error("capture_spans")
            rate_limited.warning("capture-spans", "memprof_otel: capture spans failed: %r", e)


def emit_capture_spans(otel: OtelExporter, model: str, cap: Any) -> None:
    """Per-layer child spans of one ``memprof.capture`` span, at the captured times."""
    calls = balanced_calls(cap.calls)
    if not calls:
        return
    offset_ns = time.time_ns() - time.perf_counter_ns()
    ns = lambda t: int(t * 1e9) + offset_ns  # noqa: E731
    root = otel.tracer.start_span("memprof.capture", start_time=ns(calls[0][2]), attributes={
        "memprof.model": model, "memprof.capture.forwards": cap.completed})
    stack: list[Any] = [root]
    for kind, frame, t in calls:
        if kind == "O":
            ctx = otel_trace.set_span_in_context(stack[-1])
            stack.append(otel.tracer.start_span(f"layer {frame}", context=ctx, start_time=ns(t),
                                                attributes={"memprof.layer": frame, "memprof.model": model}))
        elif len(stack) > 1:
            stack.pop().end(end_time=ns(t))
    while len(stack) > 1:
        stack.pop().end(end_time=ns(calls[-1][2]))
    root.end(end_time=ns(calls[-1][2]))
