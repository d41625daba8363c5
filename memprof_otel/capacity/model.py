"""One instrumented model's memory model: a bounded table of the distinct input shapes its
measured forwards had, and the fit over it (``fit.py``), with everything a caller needs to know
about when not to trust it.

Thread-safe: forwards ``observe()`` on their own threads (an O(1) table update under a lock);
readers refit lazily, outside the lock and off their own thread, at most once per
``refit_interval_s`` and ``REFIT_CPU_SHARE`` of a core while the table changes, so asking before
every request costs a dictionary lookup and a few multiplications.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .budget import TENSOR
from .fit import Fit, SplitFit, Term, fit, fit_with_errors, term_name, terms_for
from .shapes import CACHE_LEN

Key = tuple[tuple[str, int], ...]

# A shape's peaks come from forwards of the same shape; when their spread passes this share of the
# median, the forward's memory depends on its data (routing, early exit, a data-dependent loop),
# not its shape alone: measured spreads of repeat forwards on CPU and CUDA are well under 1 %.
VARIES_RATIO = 0.25
# A refit is pure Python holding the GIL (99 ms at 64 shapes, 265 ms at 256, measured): refits are
# spaced so they take at most this share of one core while the table keeps changing
REFIT_CPU_SHARE = 0.01
RECENT_PER_SHAPE = 16  # the median of the last 16 forwards: one outlier moves it not at all
MIN_EXTRA_SHAPES = 1   # shapes beyond the identified terms: one left out still leaves a full fit


def key_of(features: Mapping[str, int]) -> Key:
    return tuple(sorted(features.items()))


PREFILL, DECODE = "prefill", "decode"


def regime_of(features: Mapping[str, int]) -> str:
    """Forwards with a KV cache run two code paths: a prompt (the cache empty) and a decode step
    (the cache holding the context). Their peaks are different functions of the shape (measured on
    GPT-2: one fit over both was 4x off where each alone is within 5 %), so each gets its own fit.
    Models without a cache have one regime, ``prefill``."""
    return DECODE if features.get(CACHE_LEN, 0) > 0 else PREFILL


@dataclass
class ShapeRecord:
    features: dict[str, int]
    peaks: deque = field(default_factory=lambda: deque(maxlen=RECENT_PER_SHAPE))
    retained: deque = field(default_factory=lambda: deque(maxlen=RECENT_PER_SHAPE))
    count: int = 0
    last_seen: float = 0.0

    @property
    def peak(self) -> float:
        return statistics.median(self.peaks)

    @property
    def above_median(self) -> float:
        """max / median - 1 of the recent peaks: how far a repeat of this shape rose above the
        figure the fit is given; 0 with fewer than three."""
        if len(self.peaks) < 3:
            return 0.0
        m = self.peak
        return max(self.peaks) / m - 1 if m > 0 else 0.0

    @property
    def spread(self) -> float:
        """(max - min) / median of the recent peaks; 0 with fewer than three."""
        if len(self.peaks) < 3:
            return 0.0
        m = self.peak
        return (max(self.peaks) - min(self.peaks)) / m if m > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"features": dict(self.features), "forwards": self.count,
                "peak_increase_bytes": int(self.peak), "retained_bytes": int(statistics.median(self.retained)),
                "spread_ratio": round(self.spread, 4), "last_seen_unix": self.last_seen}


@dataclass(frozen=True)
class Prediction:
    """The model's answer for one shape. ``peak_bytes`` is None when it cannot answer (``reason``)."""
    features: dict[str, int]
    peak_bytes: int | None
    error_ratio: float | None       # worst leave-one-shape-out relative error
    upper_bytes: int | None         # peak_bytes * (1 + error_ratio): what a decision should use
    extrapolates: bool
    extrapolation: dict[str, float]  # feature -> how far outside the shapes seen (2.0: twice the largest)
    varies: bool                    # same shape, very different peaks: memory depends on the data
    shapes: int                     # distinct shapes the fit used
    reason: str | None = None
    # the worst rise of a repeat above its shape's median (the fit's figure), folded into upper_bytes
    repeat_ratio: float = 0.0
    unit: str = TENSOR              # what the figures count (budget.PROCESS_RESIDENT, CUDA_RESERVED, TENSOR)
    gap_ratio: float | None = None  # a tensor answer's allowance for what its limit counts beyond tensors
    gap_bytes: int | None = None    # the same allowance in bytes (CUDA: the reserved growth seen above allocated)

    def to_dict(self) -> dict[str, Any]:
        return {"features": self.features, "peak_increase_bytes": self.peak_bytes,
                "error_ratio": self.error_ratio, "upper_bytes": self.upper_bytes,
                "extrapolates": self.extrapolates, "extrapolation": self.extrapolation,
                "data_dependent": self.varies, "shapes": self.shapes, "reason": self.reason,
                "repeat_ratio": self.repeat_ratio, "unit": self.unit, "gap_ratio": self.gap_ratio,
                "gap_bytes": self.gap_bytes}


@dataclass(frozen=True)
class FitState:
    fit: Fit | SplitFit | None
    names: frozenset[str]
    rows: int
    error_ratio: float | None         # worst error on held-out shapes inside the others' range
    extrapolation_error_ratio: float | None  # worst on held-out shapes outside it
    errors: dict[Key, float]
    ranges: dict[str, tuple[int, int]]
    varies: tuple[Key, ...]
    reason: str | None
    needed: int  # more distinct shapes needed (0 when answering)
    repeat_ratio: float = 0.0  # the worst max/median - 1 over the shapes' recent repeats


class MemoryModel:
    def __init__(self, max_shapes: int = 64, refit_interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.max_shapes = max_shapes
        self.refit_interval_s = refit_interval_s
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._shapes: dict[Key, ShapeRecord] = {}
        self._version = 0
        self._fitted_version = -1
        self._fitted_at = -math.inf
        self._states: dict[str, FitState] = {}
        self._refitting = False
        self._last_refit_s = 0.0  # how long the last refit took (spaces the next one)
        self.background = True  # tests fit inline for determinism
        self.observed = 0
        self.mixed_features = 0  # forwards whose feature names differ from the table's (not modelled)

    # ---- writing ---------------------------------------------------------------------------
    def observe(self, features: Mapping[str, int], peak_increase: int, retained: int) -> None:
        if not features:
            return
        key = key_of(features)
        now = self._wall()
        with self._lock:
            rec = self._shapes.get(key)
            if rec is None:
                if self._shapes and set(features) != set(next(iter(self._shapes.values())).features):
                    self.mixed_features += 1  # one family per model: a second kind of call is not ours
                    return
                if len(self._shapes) >= self.max_shapes:
                    self._evict(regime_of(features))
                rec = self._shapes[key] = ShapeRecord(dict(features))
            rec.peaks.append(max(0, int(peak_increase)))
            rec.retained.append(int(retained))
            rec.count += 1
            rec.last_seen = now
            self.observed += 1
            self._version += 1

    def _evict(self, incoming: str) -> None:
        """Drop the least recently seen shape that holds no feature's minimum or maximum, from the
        regime with the most shapes (decode steps, one per context length, must not push out the
        prompts): the range the model can answer in survives any number of other shapes."""
        by_regime: dict[str, list[tuple[Key, ShapeRecord]]] = {}
        for kv in self._shapes.items():
            by_regime.setdefault(regime_of(kv[1].features), []).append(kv)
        by_regime.setdefault(incoming, [])
        recs = max(by_regime.values(), key=len)
        names = recs[0][1].features.keys()
        hull = set()
        for n in names:
            hull.add(min(recs, key=lambda kv: kv[1].features[n])[0])
            hull.add(max(recs, key=lambda kv: kv[1].features[n])[0])
        pool = [kv for kv in recs if kv[0] not in hull] or recs
        del self._shapes[min(pool, key=lambda kv: kv[1].last_seen)[0]]

    def clear(self) -> None:
        with self._lock:
            self._shapes.clear()
            self._version += 1

    # ---- reading ---------------------------------------------------------------------------
    def shapes(self) -> list[ShapeRecord]:
        with self._lock:
            return [ShapeRecord(dict(r.features), deque(r.peaks, RECENT_PER_SHAPE),
                                deque(r.retained, RECENT_PER_SHAPE), r.count, r.last_seen)
                    for r in self._shapes.values()]

    def states(self, force: bool = False) -> dict[str, FitState]:
        """Regime -> its fit. A table that changed is refitted at most once per refit interval:
        in the background while a fit exists (a caller asking before every request never waits
        for the tens of milliseconds a refit with its leave-one-out takes), inline for the first
        one or when ``force``d."""
        now = self._clock()
        with self._lock:
            stale = self._fitted_version != self._version
            due = force or now - self._fitted_at >= max(self.refit_interval_s,
                                                         self._last_refit_s / REFIT_CPU_SHARE)
            if not (stale and due) or (self._refitting and not force):
                return self._states
            background = bool(self._states) and not force and self.background
            self._refitting = True
            self._fitted_at = now  # one refit per interval, whichever thread does it
        if background:
            try:
                threading.Thread(target=self._refit, name="memprof-capacity-fit", daemon=True).start()
            except RuntimeError:  # no new threads (interpreter shutdown): keep the old fit
                with self._lock:
                    self._refitting = False
            return self._states
        return self._refit()

    def _refit(self) -> dict[str, FitState]:
        try:
            with self._lock:
                version = self._version
                recs = [(k, dict(r.features), r.peak, r.spread) for k, r in self._shapes.items()]
                above = {k: r.above_median for k, r in self._shapes.items()}
            started = time.perf_counter()
            states = _fit_states(recs)
            for regime, st in states.items():  # the same shape again can rise above its median
                ups = [above[k] for k, f, _, _ in recs if regime_of(f) == regime]
                states[regime] = dataclasses.replace(st, repeat_ratio=round(max(ups, default=0.0), 4))
            with self._lock:
                self._last_refit_s = time.perf_counter() - started
                if version >= self._fitted_version:
                    self._states, self._fitted_version = states, version
                return self._states
        finally:
            with self._lock:
                self._refitting = False

    def state(self, regime: str = PREFILL, force: bool = False) -> FitState:
        st = self.states(force).get(regime)
        return st if st is not None else _fit_state([])

    @property
    def error_ratio(self) -> float | None:
        """The worst leave-one-shape-out error over the regimes that answer."""
        errs = [st.error_ratio for st in self.states().values() if st.error_ratio is not None]
        return max(errs) if errs else None

    def predict(self, features: Mapping[str, int]) -> Prediction:
        feats = dict(features)
        st = self.state(regime_of(feats))
        if st.fit is None or st.reason is not None:
            return Prediction(feats, None, None, None, False, {}, bool(st.varies), st.rows,
                              st.reason or "no fit")
        missing = sorted(st.names - set(feats))
        extra = sorted(set(feats) - st.names)
        if missing or extra:
            why = (f"the model's features are {sorted(st.names)}"
                   + (f"; missing {missing}" if missing else "") + (f"; unknown {extra}" if extra else ""))
            return Prediction(feats, None, None, None, False, {}, bool(st.varies), st.rows, why)
        far = _extrapolation(feats, st.ranges)
        peak = max(0.0, st.fit.predict(feats))
        err = st.extrapolation_error_ratio if far else st.error_ratio
        up = st.repeat_ratio
        return Prediction(feats, int(round(peak)), err,
                          int(math.ceil(peak * (1 + err) * (1 + up))) if err is not None else None,
                          bool(far), far, bool(st.varies), st.rows, repeat_ratio=up)

    def largest_recent(self, since_unix: float) -> ShapeRecord | None:
        """The shape with the largest measured peak among those seen since ``since_unix``."""
        recent = [r for r in self.shapes() if r.last_seen >= since_unix]
        return max(recent, key=lambda r: r.peak) if recent else None

    def max_safe(self, available_bytes: float, fixed: Mapping[str, int], vary: str,
                 limit: int = 1 << 20, scale: float = 1.0, extra: float = 0.0) -> int | None:
        """The largest value of feature ``vary`` (others ``fixed``) whose predicted peak plus its
        error (and the rise of repeats above their median; ``scale`` and ``extra``: a tensor figure's
        allowance for what the limit counts beyond it, as a factor and in bytes) fits in ``available_bytes``: 0 when not even 1 does;
        None when the model cannot answer. The fit is non-decreasing in every feature, so a binary
        search is exact."""
        st = self.state(regime_of({**fixed, vary: 1}))
        if st.fit is None or st.reason is not None or st.error_ratio is None:
            return None
        if set(fixed) | {vary} != st.names:
            return None
        far = st.extrapolation_error_ratio if st.extrapolation_error_ratio is not None else st.error_ratio

        def slack_of(v: int) -> float:
            inside = st.ranges.get(vary, (v, v))[0] <= v <= st.ranges.get(vary, (v, v))[1] and not _extrapolation(
                fixed, st.ranges)
            return (1 + (st.error_ratio if inside else far)) * (1 + st.repeat_ratio) * scale  # type: ignore[operator]

        def ok(v: int) -> bool:
            tensor_upper = st.fit.predict({**fixed, vary: v}) * slack_of(v) / scale  # type: ignore[union-attr]
            # never below the tensor figure's own upper bound, as predictions are not (service.predict)
            return max(tensor_upper, tensor_upper * scale + extra) <= available_bytes

        if not ok(1):
            return 0
        lo, hi = 1, 2
        while hi <= limit and ok(hi):
            lo, hi = hi, hi * 2
        hi = min(hi, limit + 1)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if ok(mid) else (lo, mid)
        return lo

    def describe(self) -> dict[str, Any]:
        states = self.states()
        return {"regimes": {regime: {
                    "shapes": st.rows, "more_shapes_needed": st.needed, "reason": st.reason,
                    "error_ratio": st.error_ratio, "extrapolation_error_ratio": st.extrapolation_error_ratio,
                    "repeat_ratio": st.repeat_ratio,
                    "fit": st.fit.to_dict() if st.fit is not None else None,
                    "feature_ranges": {k: list(v) for k, v in sorted(st.ranges.items())},
                    "data_dependent_shapes": [dict(k) for k in st.varies]} for regime, st in states.items()},
                "error_ratio": self.error_ratio,
                "forwards_observed": self.observed, "forwards_with_other_features": self.mixed_features}


LOSO_MAX = 48  # shapes held out in turn: a refit stays ~50 ms however long the table (decode steps)


def _held_out(rows: list[tuple[dict[str, int], float]]) -> list[int]:
    """Every row, or ``LOSO_MAX`` of them evenly spread over the range of peaks (both ends kept)."""
    if len(rows) <= LOSO_MAX:
        return list(range(len(rows)))
    order = sorted(range(len(rows)), key=lambda i: rows[i][1])
    step = (len(order) - 1) / (LOSO_MAX - 1)
    return sorted({order[round(k * step)] for k in range(LOSO_MAX)})


def _fit_states(recs: list[tuple[Key, dict[str, int], float, float]]) -> dict[str, FitState]:
    by_regime: dict[str, list] = {}
    for rec in recs:
        by_regime.setdefault(regime_of(rec[1]), []).append(rec)
    return {regime: _fit_state(rs) for regime, rs in sorted(by_regime.items())}


def _extrapolation(feats: Mapping[str, int], ranges: Mapping[str, tuple[int, int]]) -> dict[str, float]:
    """Feature -> value / largest seen (above) or smallest seen / value (below), when outside."""
    out = {}
    for n, v in feats.items():
        lo, hi = ranges.get(n, (v, v))
        if v > hi:
            out[n] = round(v / hi, 3) if hi > 0 else math.inf
        elif v < lo:
            out[n] = round(lo / v, 3) if v > 0 else math.inf
    return out


def _fit_state(recs: list[tuple[Key, dict[str, int], float, float]]) -> FitState:
    if not recs:
        return FitState(None, frozenset(), 0, None, None, {}, {}, (), "no forward measured yet", 0)
    names = frozenset(recs[0][1])
    ranges = {n: (min(f[n] for _, f, _, _ in recs), max(f[n] for _, f, _, _ in recs)) for n in names}
    varies = tuple(k for k, _, _, s in recs if s > VARIES_RATIO)
    rows = [(f, p) for _, f, p, _ in recs if p > 0]
    terms: list[Term] = terms_for(names)
    model = fit(rows, terms) if rows else None  # one member first: is the table enough to fit?
    if model is None:
        return FitState(None, names, len(rows), None, None, {}, ranges, varies,
                        "no forward with a peak above its entry level yet", 1)
    # the family's terms that the features seen varying can identify (a feature seen at one value
    # only collapses its terms into simpler ones): that many shapes, plus one to leave out
    varying = {n for n in names if ranges[n][0] != ranges[n][1]}
    reachable = [t for t in terms if set(t) <= varying]
    need = max(model.rank, len(reachable)) + MIN_EXTRA_SHAPES - len(rows)
    if need > 0:
        constant = [n for n in sorted(names) if ranges[n][0] == ranges[n][1]]
        target = reachable if len(reachable) > model.rank else [t for t in terms if t not in model.dropped]
        why = (f"{len(rows)} distinct shapes seen; {need} more needed to fit "
               f"{', '.join(term_name(t) for t in target)} and measure its error on shapes left out")
        if constant:
            why += f" (only one value seen of: {', '.join(constant)})"
        return FitState(model, names, len(rows), None, None, {}, ranges, varies, why, need)
    held = _held_out(rows)
    fitted = fit_with_errors(rows, terms, held)
    if fitted is None:
        return FitState(None, names, len(rows), None, None, {}, ranges, varies, "the fit failed", 1)
    model, errs = fitted
    errors = {key_of(rows[i][0]): e for i, e in zip(held, errs)}
    # A held-out shape outside the range of the others is an extrapolation: its error says how far
    # predictions outside the shapes seen can be trusted, not those inside (which are most asked)
    inside, outside = [], []
    for i, e in zip(held, errs):
        f = rows[i][0]
        others = [g for j, (g, _) in enumerate(rows) if j != i]
        within = all(min(g[n] for g in others) <= f[n] <= max(g[n] for g in others) for n in names)
        (inside if within else outside).append(e)
    worst_in = max(inside) if inside else max(errs)
    worst_out = max(outside + [worst_in])
    if not math.isfinite(worst_out):
        return FitState(model, names, len(rows), None, None, errors, ranges, varies,
                        "the fit failed on a shape left out", 0)
    return FitState(model, names, len(rows), round(worst_in, 4), round(worst_out, 4), errors, ranges, varies,
                    None, 0)
