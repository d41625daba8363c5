"""Dumps on demand: deep-capture a live model's next forwards and store a speedscope file.

Used by ``POST /v1/dumps``, the watchdog's ``dump`` action and the OOM flight recorder. The
capture itself lives in ``capture.py`` and the file format in ``speedscope.py``; this module only
picks the model, waits under a deadline, stores the result with rotation and counts the outcome in
``memprof_dumps_total{format,result}``. Inside a capture, per-layer OTel spans are emitted.
"""
from __future__ import annotations

import threading
import time
from typing import Any

from ._log import rate_limited
from .capture import Capture
from .dump_store import DumpInfo, DumpStore
from .errors import CaptureBusy, CaptureTimeout, MemprofError, UnknownModel
from .instrumentation import Instrumentation, live_instrumentations
from .runtime import runtime
from .speedscope import balanced_calls
from .timeline_export import ExportError


def pick_model(name: str | None) -> Instrumentation:
    live = live_instrumentations()
    if name:
        h = live.get(name)
        if h is None:
            known = ", ".join(sorted(live)) or "none"
            raise UnknownModel(f"no instrumented model named {name!r} (instrumented: {known})")
        return h
    if not live:
        raise UnknownModel("no model is instrumented in this process")
    if len(live) > 1:
        raise UnknownModel(f"several models are instrumented ({', '.join(sorted(live))}); pass model=NAME")
    return next(iter(live.values()))


class DumpService:
    def __init__(self) -> None:
        self._store: DumpStore | None = None
        self._store_key: tuple[Any, ...] | None = None
        self._lock = threading.Lock()
        self.related: dict[str, DumpInfo] = {}  # speedscope dump id -> its CUDA history snapshot

    @property
    def store(self) -> DumpStore:
        cfg = runtime().config
        from .config import DumpsConfig

        d = cfg.dumps if cfg is not None else DumpsConfig()
        key = (d.dir, d.max_files, d.max_bytes, d.max_oom_files)
        with self._lock:
            if self._store is None or self._store_key != key:
                store = DumpStore(d.dir, d.max_files, d.max_bytes, max_oom_files=d.max_oom_files)
                self._store, self._store_key = store, key
            return self._store

    def capture(self, model: str | None, forwards: int = 1, timeout: float = 30.0,
                reason: str = "api") -> DumpInfo:
        """Capture the next ``forwards`` forwards of ``model`` and store the speedscope file.
        Raises UnknownModel, CaptureBusy, CaptureTimeout, ExportError (all counted)."""
        rt = runtime()
        h = pick_model(model)
        try:
            cap = h.capture(forwards)
        except CaptureBusy:
            rt.count_dump("speedscope", "busy")
            raise
        if not cap.wait(timeout):
            cap.cancel()
            rt.count_dump("speedscope", "timeout")
            raise CaptureTimeout(f"no forward of {h.name!r} completed within {timeout:g} s "
                                 f"({cap.completed}/{forwards} captured)")
        return self.store_capture(h.name, cap, reason)

    def store_capture(self, model: str, cap: Capture, reason: str) -> DumpInfo:
        rt = runtime()
        try:
            doc = cap.speedscope()
            doc.setdefault("name", f"{model} ({reason})")
            info = self.store.save(doc, kind="speedscope", model=model)
        except (ExportError, OSError, ValueError) as e:
            rt.count_dump("speedscope", "error")
            raise ExportError(f"could not store the dump: {e}") from e
        rt.count_dump("speedscope", "ok")
        if cap.cuda_snapshot is not None:  # memory_viz's data; `python -m pickle`-able after json.load
            snap = self.store_json(cap.cuda_snapshot, kind="cuda_snapshot", model=model)
            if snap is not None:
                with self._lock:
                    self.related[info.id] = snap
                    while len(self.related) > 1000:
                        self.related.pop(next(iter(self.related)))
        return info

    def store_json(self, doc: dict[str, Any], kind: str, model: str) -> DumpInfo | None:
        """Store a non-speedscope dump (e.g. an OOM flight record); errors are counted, not raised."""
        rt = runtime()
        try:
            info = self.store.save(doc, kind=kind, model=model)
        except Exception as e:
            rt.count_dump(kind, "error")
            rate_limited.warning(f"dump:{kind}", "memprof_otel: could not store a %s dump: %r", kind, e)
            return None
        rt.count_dump(kind, "ok")
        return info

    def capture_all(self, reason: str, forwards: int = 1, timeout: float = 60.0) -> list[DumpInfo]:
        """The watchdog's dump action: capture every live model (errors counted and logged)."""
        out = []
        live = sorted(live_instrumentations())
        if not live:
            runtime().count_dump("speedscope", "no_model")
            rate_limited.warning("dump-all", "memprof_otel: dump for %s skipped: no model is instrumented", reason)
        for name in live:
            try:
                out.append(self.capture(name, forwards, timeout, reason))
            except MemprofError as e:
                rate_limited.warning("dump-all", "memprof_otel: dump of %s for %s failed: %s", name, reason, e)
        return out

def emit_capture_spans(model: str, cap: Capture) -> None:
    """Per-layer child spans of one ``memprof.capture`` span, at the captured times."""
    otel = runtime().otel
    if otel is None:
        return
    try:
        calls = balanced_calls(cap.calls)
        if not calls:
            return
        offset_ns = time.time_ns() - time.perf_counter_ns()
        ns = lambda t: int(t * 1e9) + offset_ns  # noqa: E731
        root = otel.tracer.start_span("memprof.capture", start_time=ns(calls[0][2]), attributes={
            "memprof.model": model, "memprof.capture.forwards": cap.completed})
        from opentelemetry import trace as otel_trace

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
    except Exception as e:
        runtime().count_export_error("capture_spans")
        rate_limited.warning("capture-spans", "memprof_otel: capture spans failed: %r", e)


_service: DumpService | None = None
_service_lock = threading.Lock()


def dump_service() -> DumpService:
    global _service
    with _service_lock:
        if _service is None:
            _service = DumpService()
        return _service
