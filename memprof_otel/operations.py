"""``operation(name)`` and ``mark_operation(name)``: named stretches of work with their memory.

An operation is opened in the caller's context (contextvars, so nesting follows threads and
asyncio tasks), reads process RSS and allocator levels at its start and end (a statm pread and the
sources' cached readings: microseconds), and grows its peak from every sampler tick while open.
Phases (``mark_operation``) are process-wide: each mark ends the previous phase.
"""
from __future__ import annotations

import asyncio
import contextvars
import functools
import itertools
import threading
import time
from collections import deque
from typing import Any, Callable, Protocol, TypeVar

from ._log import rate_limited
from .errors import MemprofError
from .oom import is_oom
from .timeline import OperationRecord, Sample

F = TypeVar("F", bound=Callable[..., Any])

_current: contextvars.ContextVar[OperationRecord | None] = contextvars.ContextVar(
    "memprof_operation", default=None)


class SpanHooks(Protocol):
    """What the OTel exporter provides: open a span for a record, close it with its figures."""

    def start(self, record: OperationRecord) -> Any: ...
    def activate(self, span: Any) -> Any: ...          # returns a token for deactivate
    def deactivate(self, token: Any) -> None: ...
    def end(self, span: Any, record: OperationRecord, exc: BaseException | None) -> None: ...


class MemoryProbe(Protocol):
    def rss(self) -> int: ...
    def allocators(self) -> dict[str, int]: ...


class OperationTracker:
    """Open and finished operations; finished ones are kept in a bounded deque."""

    # ~1.1 KiB per finished record (measured with tracemalloc): 2,000 keep ~2.2 MiB, the report's
    # and /v1/timeline's recent history, inside the library's memory budget (docs/benchmarks.md)
    def __init__(self, probe: MemoryProbe, max_records: int = 2_000) -> None:
        self.probe = probe
        self.spans: SpanHooks | None = None
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._open: dict[int, OperationRecord] = {}
        self._finished: deque[OperationRecord] = deque(maxlen=max_records)
        self._phase: OperationRecord | None = None
        self._on_end: list[Callable[[OperationRecord], None]] = []
        self.errors = 0

    def add_end_listener(self, fn: Callable[[OperationRecord], None]) -> None:
        self._on_end.append(fn)

    # ---- records ---------------------------------------------------------------------------
    def begin(self, name: str, attributes: dict[str, Any], kind: str = "operation") -> OperationRecord:
        rss, allocs = self._read()
        parent = _current.get() if kind == "operation" else None
        rec = OperationRecord(id=next(self._ids), name=name, kind=kind, start=time.time(), rss_start=rss,
                              attributes=attributes, parent_id=parent.id if parent is not None else None,
                              thread=threading.current_thread().name, rss_peak=rss,
                              device_start=dict(allocs), device_peak=dict(allocs))
        with self._lock:
            self._open[rec.id] = rec
        return rec

    def end(self, rec: OperationRecord, exc: BaseException | None = None) -> None:
        rss, allocs = self._read()
        rec.observe(rss, allocs)
        rec.rss_end = rss
        rec.end = time.time()
        if exc is not None:
            rec.error = type(exc).__name__
            rec.oom = is_oom(exc)
        with self._lock:
            self._open.pop(rec.id, None)
            self._finished.append(rec)
        for fn in self._on_end:
            try:
                fn(rec)
            except Exception as e:
                self._count("end-listener", e)

    def _read(self) -> tuple[int, dict[str, int]]:
        try:
            return int(self.probe.rss()), self.probe.allocators()
        except Exception as e:
            self._count("probe", e)
            return 0, {}

    def _count(self, where: str, e: BaseException) -> None:
        self.errors += 1
        rate_limited.warning(f"operation:{where}", "memprof_otel: operation %s failed: %r (counted)", where, e)

    def observe(self, sample: Sample) -> None:
        """Sampler listener: grow the peaks of every open operation."""
        allocs = {d: int(f.get("allocated_bytes", 0)) for d, f in sample.allocators.items()}
        with self._lock:
            recs = list(self._open.values())
        for r in recs:
            r.observe(sample.rss, allocs)

    # ---- phases ----------------------------------------------------------------------------
    def mark(self, name: str, attributes: dict[str, Any]) -> OperationRecord:
        with self._lock:
            prev, self._phase = self._phase, None
        if prev is not None:
            self._end_with_span(prev, None)
        rec = self.begin(name, attributes, kind="phase")
        self._start_span(rec)
        with self._lock:
            self._phase = rec
        return rec

    def end_phase(self) -> None:
        with self._lock:
            prev, self._phase = self._phase, None
        if prev is not None:
            self._end_with_span(prev, None)

    def _start_span(self, rec: OperationRecord) -> None:
        if self.spans is None:
            return
        try:
            setattr(rec, "_span", self.spans.start(rec))
        except Exception as e:
            self._count("span-start", e)

    def _end_with_span(self, rec: OperationRecord, exc: BaseException | None) -> None:
        self.end(rec, exc)
        span = getattr(rec, "_span", None)
        if span is not None and self.spans is not None:
            try:
                self.spans.end(span, rec, exc)
            except Exception as e:
                self._count("span-end", e)

    # ---- views -----------------------------------------------------------------------------
    def current_name(self) -> str | None:
        """The most recently started open operation anywhere (what a sample is labelled with)."""
        with self._lock:
            if not self._open:
                return None
            rec = max(self._open.values(), key=lambda r: (r.kind == "operation", r.start, r.id))
        return rec.name

    def records(self, since_unix: float | None = None) -> list[OperationRecord]:
        with self._lock:
            out = list(self._finished) + list(self._open.values())
        if since_unix is not None:
            out = [r for r in out if r.end is None or r.end >= since_unix]
        return sorted(out, key=lambda r: (r.start, r.id))

    def clear(self) -> None:
        with self._lock:
            self._finished.clear()


class operation:
    """``with operation("generate", model="gpt2"):`` / ``@operation("embed")`` (sync or async).

    Opens an OTel span (attributes ``memprof.memory.peak_bytes``, ``memprof.memory.delta_bytes``),
    records duration, peak and delta. Telemetry failures are counted, never raised; the body's
    own exception propagates unchanged.
    """

    def __init__(self, name: str, **attributes: Any) -> None:
        if not isinstance(name, str) or not name:
            raise MemprofError(f"operation name must be a non-empty string, got {name!r}")
        self.name = name
        self.attributes = attributes
        # per context, so one operation object shared by threads or tasks closes the right record
        self._stacks: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar(
            f"memprof_operation_stack_{id(self)}", default=())

    def __enter__(self) -> OperationRecord | None:
        from .runtime import runtime

        tracker = runtime().operations_tracker()
        if tracker is None:
            return None
        rec = tracker.begin(self.name, dict(self.attributes))
        span = token = None
        if tracker.spans is not None:
            try:
                span = tracker.spans.start(rec)
                token = tracker.spans.activate(span)
            except Exception as e:
                tracker._count("span-start", e)
        entry = [rec, _current.set(rec), span, token, None]
        # the token lets __exit__ take the variable out of the context again: a context keeps every
        # variable ever set in it, and each operation object has its own (~170 B per operation)
        entry[4] = self._stacks.set(self._stacks.get() + (entry,))
        return rec

    def __exit__(self, et: Any, exc: BaseException | None, tb: Any) -> None:
        stack = self._stacks.get()
        if not stack:
            return
        from .runtime import runtime

        rec, ctx_token, span, token, stack_token = stack[-1]
        try:
            self._stacks.reset(stack_token)  # back to unset when this was the outermost entry
        except (ValueError, RuntimeError):  # exited in another context or out of order
            self._stacks.set(stack[:-1])
        tracker = runtime().operations_tracker()
        try:
            _current.reset(ctx_token)
        except ValueError:  # exited in another context (a generator moved across tasks)
            _current.set(None)
        if tracker is None:
            return
        tracker.end(rec, exc)
        if tracker.spans is not None and span is not None:
            try:
                tracker.spans.end(span, rec, exc)
                if token is not None:
                    tracker.spans.deactivate(token)
            except Exception as e:
                tracker._count("span-end", e)

    async def __aenter__(self) -> OperationRecord | None:
        return self.__enter__()

    async def __aexit__(self, et: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(et, exc, tb)

    def __call__(self, fn: F) -> F:
        name, attrs = self.name, self.attributes
        if asyncio.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def awrapper(*args: Any, **kwargs: Any) -> Any:
                async with operation(name, **attrs):
                    return await fn(*args, **kwargs)
            return awrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with operation(name, **attrs):
                return fn(*args, **kwargs)
        return wrapper  # type: ignore[return-value]


def current_operation() -> OperationRecord | None:
    """The innermost operation open in this context (thread / asyncio task)."""
    return _current.get()
