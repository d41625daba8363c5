"""Growth detection: is a memory figure really growing? Pure logic: no torch, no threads, no clock.

Memory figures move in ways that are not leaks: a KV cache filled during a request and dropped at
its end (a sawtooth), an allocator cache or lazily built state that grows once and plateaus, the
first minutes of a process (warm-up). A leak is a floor that keeps rising. So, per series:

1. readings within ``warmup`` of the series' first reading are left out;
2. the rest are cut into intervals of ``floor_interval``; each interval gives one point, its
   **floor** (the minimum): a sawtooth whose period is shorter than the interval has a flat floor;
3. the trend is the **Theil-Sen** slope (median of the pairwise slopes) of the floors of the last
   ``trend_window``, with its confidence interval from Kendall's tau (Sen 1968): robust to
   outliers and to a few steps, where least squares would follow them;
4. a fit is **significant** when the slope is, not merely positive: the interval's lower bound is
   above ``min_growth_rate`` AND the growth over the window (slope times the span of the floors) is
   at least ``min_growth_bytes``, with at least ``MIN_POINTS`` floors;
5. a leak is **suspected** after ``CONFIRM`` significant fits in a row. Windows slide by one floor,
   so each fit is one more test on mostly the same data: on pure noise, a 95 % interval alone
   raised a false alarm in most runs of 300 floors; 99.9 % (the default ``leaks.confidence``) and
   three fits in a row raised none in 60 such runs (tests/unit/telemetry/test_growth.py has the
   noisy cases).

A plateau (one step up, then flat: an allocator cache, lazy init) never passes: the pairs of
floors across a single step are at most about half of all pairs, so the lower bound of the median
slope is a pair on one side of the step, a slope of 0. A staircase of many steps does pass.
"""
from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from statistics import NormalDist

MIN_POINTS = 6  # floors needed before a trend is reported at all
CONFIRM = 3     # significant fits in a row before a leak is suspected


@dataclass(frozen=True)
class GrowthParams:
    floor_interval: float      # seconds per floor point
    trend_window: float        # seconds of floors fitted
    warmup: float              # seconds after a series' first reading left out
    min_growth_rate: float     # bytes/s the lower confidence bound must exceed
    min_growth_bytes: float    # slope * span needed
    confidence: float          # two-sided confidence of the slope's interval

    def __post_init__(self) -> None:
        if not self.floor_interval > 0 or not self.trend_window > 0 or self.warmup < 0:
            raise ValueError("floor_interval and trend_window must be > 0, warmup >= 0")
        if not 0.5 <= self.confidence < 1.0:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence}")

    @property
    def points(self) -> int:
        """Floors kept per series: the window in intervals (at least MIN_POINTS)."""
        return max(MIN_POINTS, int(round(self.trend_window / self.floor_interval)))


@dataclass(frozen=True)
class Trend:
    """The fitted trend of one series over its window of floors."""
    slope: float        # bytes per second (Theil-Sen)
    low: float          # lower confidence bound of the slope
    high: float         # upper confidence bound
    growth: float       # slope * (end - start): bytes the floor grew by over the window
    points: int         # floors fitted
    start: float        # time of the first floor fitted (the window measured over)
    end: float          # time of the last floor fitted
    last_floor: float   # the latest floor (bytes)
    significant: bool   # this fit alone passes the thresholds
    suspected: bool     # CONFIRM fits in a row have

    def to_dict(self) -> dict[str, object]:
        return {"slope_bytes_per_second": self.slope, "slope_low": self.low, "slope_high": self.high,
                "growth_bytes": self.growth, "points": self.points, "window_start_unix": self.start,
                "window_end_unix": self.end, "window_seconds": self.end - self.start,
                "last_floor_bytes": self.last_floor, "significant": self.significant,
                "suspected": self.suspected}


def theil_sen(points: list[tuple[float, float]], confidence: float = 0.95) -> tuple[float, float, float]:
    """(slope, low, high) of the Theil-Sen estimator over (x, y) points with distinct x.

    The interval is Sen's: with N pairwise slopes sorted and C = z * sqrt(n(n-1)(2n+5)/18) (the
    standard deviation of Kendall's S), the bounds are the slopes of rank (N - C)/2 and
    (N + C)/2 + 1, clamped to the ends. O(n^2): windows here are tens of points.
    """
    n = len(points)
    if n < 2:
        raise ValueError("a trend needs at least two points")
    slopes = sorted((yj - yi) / (xj - xi)
                    for i, (xi, yi) in enumerate(points) for xj, yj in points[i + 1:] if xj != xi)
    m = len(slopes)
    if m == 0:
        raise ValueError("a trend needs points at two distinct times")
    mid = m // 2
    slope = slopes[mid] if m % 2 else (slopes[mid - 1] + slopes[mid]) / 2.0
    z = NormalDist().inv_cdf((1.0 + confidence) / 2.0)
    c = z * math.sqrt(n * (n - 1) * (2 * n + 5) / 18.0)
    lo_rank = int(math.floor((m - c) / 2.0))          # 1-based rank of the lower bound
    hi_rank = int(math.ceil((m + c) / 2.0)) + 1       # 1-based rank of the upper bound
    low = slopes[min(m - 1, max(0, lo_rank - 1))]
    high = slopes[min(m - 1, max(0, hi_rank - 1))]
    return slope, low, high


class _Series:
    __slots__ = ("first_t", "bucket", "bucket_min", "floors", "trend", "streak")

    def __init__(self, t: float, maxlen: int) -> None:
        self.first_t = t
        self.bucket: int | None = None      # index of the open interval
        self.bucket_min = math.inf
        self.floors: deque[tuple[float, float]] = deque(maxlen=maxlen)
        self.trend: Trend | None = None
        self.streak = 0                     # significant fits in a row


class GrowthDetector:
    """Per-key floors and trends. ``observe(key, t, value)`` for each reading, in time order per key.

    Not thread-safe: the caller serialises calls (the telemetry adapter holds a lock).
    """

    def __init__(self, params: GrowthParams) -> None:
        self.params = params
        self._series: dict[Hashable, _Series] = {}

    def observe(self, key: Hashable, t: float, value: float) -> Trend | None:
        """Feed one reading; returns the key's current trend (None before it has one)."""
        p = self.params
        s = self._series.get(key)
        if s is None:
            s = self._series[key] = _Series(t, p.points)
        start = s.first_t + p.warmup
        if t < start or not math.isfinite(value):
            return s.trend
        bucket = int((t - start) // p.floor_interval)
        if s.bucket is not None and bucket != s.bucket:
            if bucket < s.bucket:
                return s.trend  # a reading from the past (a clock step back): left out
            self._close(s, start)
        if bucket != s.bucket:
            s.bucket, s.bucket_min = bucket, value
        elif value < s.bucket_min:
            s.bucket_min = value
        return s.trend

    def _close(self, s: _Series, start: float) -> None:
        p = self.params
        # the floor is placed at its interval's middle: where in the interval the minimum fell
        # is noise (a sawtooth's trough moves), the interval's position is not
        assert s.bucket is not None
        s.floors.append((start + (s.bucket + 0.5) * p.floor_interval, s.bucket_min))
        trend = fit(list(s.floors), p)
        s.streak = s.streak + 1 if trend is not None and trend.significant else 0
        if trend is not None and s.streak >= CONFIRM:
            trend = dataclasses.replace(trend, suspected=True)
        s.trend = trend

    def observe_all(self, t: float, readings: Mapping[Hashable, float]) -> None:
        """One reading per key at time ``t``; keys not in ``readings`` are forgotten (a model
        uninstrumented, a layer gone: their figures must not linger)."""
        for key in [k for k in self._series if k not in readings]:
            del self._series[key]
        for key, value in readings.items():
            self.observe(key, t, value)

    def trends(self) -> dict[Hashable, Trend]:
        return {k: s.trend for k, s in self._series.items() if s.trend is not None}

    def keys(self) -> list[Hashable]:
        return list(self._series)

    def clear(self) -> None:
        self._series.clear()


def fit(floors: list[tuple[float, float]], p: GrowthParams) -> Trend | None:
    """The trend of a window of floors, or None with fewer than MIN_POINTS (``suspected`` is the
    detector's to set: it needs the fits before this one)."""
    if len(floors) < MIN_POINTS:
        return None
    slope, low, high = theil_sen(floors, p.confidence)
    start, end = floors[0][0], floors[-1][0]
    growth = slope * (end - start)
    significant = low > p.min_growth_rate and growth >= p.min_growth_bytes
    return Trend(slope, low, high, growth, len(floors), start, end, floors[-1][1], significant, False)
