"""Operations and phases: named stretches of work with their memory (``mp.operation`` and
``mp.mark_operation`` open them through the process runtime's tracker).

An operation is opened in the caller's context (contextvars, so nesting follows threads and
asyncio tasks), reads process RSS and allocator levels at its start and end (a statm pread and the
sources' cached readings: microseconds), and grows its peak from every sampler tick while open.
Phases (``mark_operation``) are process-wide: each mark ends the previous phase.
"""
from __future__ import annotations

import contextvars
import itertools
import threading
import time
from collections import deque
from typing import Any, Callable, Protocol

from .._log import rate_limited
from ..oom import is_oom
from ..timeline import OperationRecord, Sample

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
        # one mark/end_phase at a time, whole: ending the previous phase and opening the next must
        # not interleave with another thread's (two marks at once each stored their phase, one
        # overwrote the other, and the lost one never ended). Apart from _lock, which begin/end take.
        self._phase_lock = threading.Lock()
        self._on_end: list[Callable[[OperationRecord], None]] = []
        self.errors = 0

    def add_end_listener(self, fn: Callable[[OperationRecord], None]) -> None:
        self._on_end.append(fn)

    def after_fork(self) -> None:
        """In a forked child: another thread of the parent may have held the lock at the fork.
        Open records stay (an operation open around the fork ends in the child that goes on)."""
        self._lock = threading.Lock()
        self._phase_lock = threading.Lock()

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
                self.count_error("end-listener", e)

    def _read(self) -> tuple[int, dict[str, int]]:
        # apart, so a failing allocator read leaves the RSS figure (and the reverse)
        rss, allocs = 0, {}
        try:
            rss = int(self.probe.rss())
        except Exception as e:
            self.count_error("probe", e)
        try:
            allocs = self.probe.allocators()
        except Exception as e:
            self.count_error("probe", e)
        return rss, allocs

    def count_error(self, where: str, e: BaseException) -> None:
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
        with self._phase_lock:
            prev, self._phase = self._phase, None
            if prev is not None:
                self._end_with_span(prev, None)
            rec = self.begin(name, attributes, kind="phase")
            self._start_span(rec)
            self._phase = rec
            return rec

    def end_phase(self) -> None:
        with self._phase_lock:
            prev, self._phase = self._phase, None
            if prev is not None:
                self._end_with_span(prev, None)

    def _start_span(self, rec: OperationRecord) -> None:
        if self.spans is None:
            return
        try:
            setattr(rec, "_span", self.spans.start(rec))
        except Exception as e:
            self.count_error("span-start", e)

    def _end_with_span(self, rec: OperationRecord, exc: BaseException | None) -> None:
        self.end(rec, exc)
        span = getattr(rec, "_span", None)
        if span is not None and self.spans is not None:
            try:
                self.spans.end(span, rec, exc)
            except Exception as e:
                self.count_error("span-end", e)

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


def current_operation() -> OperationRecord | None:
    """The innermost operation open in this context (thread / asyncio task)."""
    return _current.get()


def set_current(rec: OperationRecord | None) -> contextvars.Token[OperationRecord | None]:
    """Make ``rec`` the innermost operation of this context; returns the token to undo it."""
    return _current.set(rec)


def reset_current(token: contextvars.Token[OperationRecord | None]) -> None:
    try:
        _current.reset(token)
    except ValueError:  # exited in another context (a generator moved across tasks)
        _current.set(None)
