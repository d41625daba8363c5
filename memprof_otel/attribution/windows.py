"""Per-layer peaks over fixed windows: what the exporters publish.

Exported peaks are maxima over the last *completed* window (``attribution.window``), so two
scrapers a few seconds apart read the same value and a one-off spike stays visible for a whole
window instead of being overwritten by the next forward. A layer that had no attributed call in
the last window keeps its last known figures (a gauge should not blink out while the model idles).
Before the first window completes, the current partial window is shown so a new process is not
blank for a minute. Pure: the clock is passed in.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import NamedTuple

from .peaks import LayerCall


class WindowFigures(NamedTuple):
    peak_increase: int
    peak_allocated: int
    retained: int
    fragmentation: float | None  # mean over the window's calls that measured it


class _W:
    __slots__ = ("inc", "alloc", "ret", "frag_sum", "frag_n")

    def __init__(self) -> None:
        self.inc = 0
        self.alloc = 0
        self.ret: int | None = None
        self.frag_sum = 0.0
        self.frag_n = 0

    def figures(self) -> WindowFigures:
        return WindowFigures(self.inc, self.alloc, self.ret or 0,
                             self.frag_sum / self.frag_n if self.frag_n else None)


class WindowedPeaks:
    def __init__(self, window_s: float, start: float) -> None:
        if window_s <= 0:
            raise ValueError("window must be positive")
        self.window_s = window_s
        self._start = start
        self._current: dict[str, _W] = {}
        self._published: dict[str, WindowFigures] = {}
        self._completed_any = False
        self._lock = threading.Lock()

    def _roll(self, now: float) -> None:
        if now < self._start + self.window_s:
            return
        for path, w in self._current.items():
            self._published[path] = w.figures()
        # a window without calls (instrumented, then idle) publishes nothing: keep showing the
        # partial window until one with calls completes, else the first forwards stay invisible
        self._completed_any = self._completed_any or bool(self._current)
        self._current = {}
        # align to the window grid so idle gaps do not shift later windows
        self._start += self.window_s * ((now - self._start) // self.window_s)

    def merge(self, calls: Iterable[LayerCall], baseline: int, now: float) -> None:
        with self._lock:
            self._roll(now)
            current = self._current
            for path, entry, peak, exit_level, _allocs, _frees, _dur, frag, _raised, _rpeak in calls:
                w = current.get(path)
                if w is None:
                    w = current[path] = _W()
                inc = peak - entry
                if inc > w.inc:
                    w.inc = inc
                level = peak + baseline
                if level > w.alloc:
                    w.alloc = level
                ret = exit_level - entry
                if w.ret is None or ret > w.ret:
                    w.ret = ret
                if frag is not None:
                    w.frag_sum += frag
                    w.frag_n += 1

    def exported(self, now: float) -> dict[str, WindowFigures]:
        with self._lock:
            self._roll(now)
            if self._completed_any:
                return dict(self._published)
            return {p: w.figures() for p, w in self._current.items()}

    def clear(self) -> None:
        with self._lock:
            self._current.clear()
            self._published.clear()
            self._completed_any = False
