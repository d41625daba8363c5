"""Per-operation-name histograms (duration, memory level at the peak, own peak increase) and
last delta, for the exporters.

The ``operation`` label is bounded: past ``max_names`` distinct names, new names fold into
``__other__`` (a request id passed as a name must not explode the series count). Each bucket keeps
its latest exemplar (trace id), which OpenMetrics exposition attaches to the bucket line.
"""
from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import Sequence

from ..attribution.selection import OTHER
from ..metric_names import DURATION_BUCKETS, MEMORY_PEAK_BUCKETS
from ..timeline import OperationRecord


@dataclass
class Histogram:
    bounds: Sequence[float]
    counts: list[int] = field(default_factory=list)    # per bucket, last one is +Inf
    exemplars: list[tuple[str, float, float] | None] = field(default_factory=list)  # trace id, value, ts
    sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        n = len(self.bounds) + 1
        self.counts = [0] * n
        self.exemplars = [None] * n

    def observe(self, value: float, trace_id: str | None = None, ts: float = 0.0) -> None:
        i = bisect.bisect_left(self.bounds, value)
        self.counts[i] += 1
        self.sum += value
        self.count += 1
        if trace_id:
            self.exemplars[i] = (trace_id, value, ts)

    def cumulative(self) -> list[tuple[str, int, tuple[str, float, float] | None]]:
        """(le, cumulative count, exemplar) as Prometheus buckets."""
        out, acc = [], 0
        for i, c in enumerate(self.counts):
            acc += c
            le = "+Inf" if i == len(self.bounds) else _fmt(self.bounds[i])
            out.append((le, acc, self.exemplars[i]))
        return out


    def coarse(self, bounds: Sequence[float]) -> Histogram:
        """This histogram with only ``bounds`` (a subset of its own): each kept bucket takes the
        buckets merged into it, so the cumulative count at every kept bound is exact, and the
        latest of their exemplars."""
        missing = set(bounds) - set(self.bounds)
        if missing:
            raise ValueError(f"bounds {sorted(missing)} are not bounds of this histogram")
        out = Histogram(tuple(sorted(bounds)))
        out.sum, out.count = self.sum, self.count
        for i, (c, ex) in enumerate(zip(self.counts, self.exemplars)):
            # the fine bucket i holds values <= bounds[i] (+Inf for the last): it goes to the first
            # kept bucket whose bound is at least that
            j = len(out.bounds) if i == len(self.bounds) else bisect.bisect_left(out.bounds, self.bounds[i])
            out.counts[j] += c
            if ex is not None and (out.exemplars[j] is None or ex[2] >= out.exemplars[j][2]):
                out.exemplars[j] = ex
        return out


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


@dataclass
class OperationFigures:
    duration: Histogram
    peak: Histogram           # the level at the operation's peak
    peak_increase: Histogram  # peak minus the level at the start: the operation's own need
    last_delta: float = 0.0


class OperationStats:
    def __init__(self, max_names: int = 50) -> None:
        self.max_names = max_names
        self._by_name: dict[str, OperationFigures] = {}
        self._lock = threading.Lock()

    def record(self, rec: OperationRecord) -> str | None:
        """Fold a finished operation in; returns the ``operation`` label it went under."""
        if rec.end is None:
            return None
        with self._lock:
            name = rec.name
            if name not in self._by_name and len(self._by_name) >= self.max_names:
                name = OTHER
            f = self._by_name.get(name)
            if f is None:
                f = self._by_name[name] = OperationFigures(Histogram(DURATION_BUCKETS),
                                                           Histogram(MEMORY_PEAK_BUCKETS),
                                                           Histogram(MEMORY_PEAK_BUCKETS))
            f.duration.observe(rec.duration, rec.trace_id, rec.end)
            f.peak.observe(float(rec.peak_bytes), rec.trace_id, rec.end)
            f.peak_increase.observe(float(rec.peak_increase_bytes), rec.trace_id, rec.end)
            f.last_delta = float(rec.delta_bytes)
            return name

    def snapshot(self) -> dict[str, OperationFigures]:
        with self._lock:
            # copies, so an exporter never reads a histogram mid-update
            return {n: OperationFigures(_copy(f.duration), _copy(f.peak), _copy(f.peak_increase),
                                        f.last_delta)
                    for n, f in self._by_name.items()}

    def delta_series(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """``memprof_operation_memory_delta_bytes``: each operation's last memory delta (a series
        contributor; nothing while no operation has ended)."""
        snap = self.snapshot()
        if not snap:
            return {}
        return {"memprof_operation_memory_delta_bytes": [({"operation": op}, f.last_delta)
                                                         for op, f in sorted(snap.items())]}

    def clear(self) -> None:
        with self._lock:
            self._by_name.clear()

    def after_fork(self) -> None:
        """In a forked child: a fresh lock (the parent's may have been held at the fork) and no
        figures (the parent's operations are the parent's series, not this process's)."""
        self._lock = threading.Lock()
        self._by_name.clear()


def _copy(h: Histogram) -> Histogram:
    c = Histogram(h.bounds)
    c.counts, c.exemplars, c.sum, c.count = list(h.counts), list(h.exemplars), h.sum, h.count
    return c
