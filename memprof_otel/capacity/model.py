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

from ..errors import ShapeError
from .memory_budget import TENSOR
from .fit import Fit, SplitFit, Term, fit, fit_with_errors, term_name, terms_for
from .shapes import CACHE_LEN, LOGITS, SEQ_LEN, STANDARD, canonical, implied

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
# Kinds of call a model keeps apart (feature sets a shape_of answers): beyond these, counted only
MAX_FAMILIES = 4
# The least an answer's error grows per multiple of the range seen it lies beyond (a floor, not a
# measurement: where the shapes left out show more, the measured growth applies). A fit that was
# exact on every shape seen still says it is less sure twice as far out.
GROWTH_FLOOR = 0.01
FEW_SHAPES = 8  # a kind of call with fewer shapes kept learns from any new one (worth_measuring)
OPTIONAL = frozenset((CACHE_LEN, LOGITS))  # implied when a call does not give them (shapes.implied)


def key_of(features: Mapping[str, int]) -> Key:
    return tuple(sorted(features.items()))


PREFILL, DECODE = "prefill", "decode"
Family = tuple[str, frozenset]  # (regime, the names a call of this kind must give)


def base_of(features: Mapping[str, int]) -> frozenset:
    """The names a call must give: its features less the implied ones."""
    return frozenset(features) - OPTIONAL


def family_of(features: Mapping[str, int]) -> Family:
    """Calls are modelled together when they give the same names (less the implied ones) in the
    same regime; ``features`` canonical (``shapes.canonical``)."""
    return regime_of(features), base_of(features)


def names_text(names: Any) -> str:
    return "[" + ", ".join(sorted(names)) + "]"


def extrapolation_factor(far: Mapping[str, float]) -> float:
    """How far outside the shapes seen, as one number: the product of each feature's factor (2.0:
    twice the largest value seen; two features each twice: 4.0, as a batch x length term grows);
    1.0 inside the range."""
    out = 1.0
    for v in far.values():
        out *= v
    return out


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
    """The model's answer for one shape. ``peak_increase_bytes`` is None when it cannot answer
    (``reason``). ``peak_bytes`` and ``varies`` are the older names of ``peak_increase_bytes`` and
    ``data_dependent``, kept as aliases."""
    features: dict[str, int]
    peak_increase_bytes: int | None
    error_ratio: float | None       # the error it carries: measured on shapes left out, grown with the distance out
    upper_bytes: int | None         # peak * (1 + error_ratio) * (1 + repeat_ratio): what a decision should use
    extrapolates: bool
    extrapolation: dict[str, float]  # feature -> how far outside the shapes seen (2.0: twice the largest)
    data_dependent: bool            # same shape, very different peaks: memory depends on the data
    shapes: int                     # distinct shapes the fit used
    reason: str | None = None
    # the worst rise of a repeat above its shape's median (the fit's figure), folded into upper_bytes
    repeat_ratio: float = 0.0
    unit: str = TENSOR              # what the figures count (memory_budget.PROCESS_RESIDENT, CUDA_RESERVED, TENSOR)
    gap_ratio: float | None = None  # a tensor answer's allowance for what its limit counts beyond tensors
    gap_bytes: int | None = None    # the same allowance in bytes (CUDA: the reserved growth seen above allocated)
    extrapolation_factor: float = 1.0  # the product of ``extrapolation``'s factors; 1.0 inside the shapes seen
    regime: str | None = None       # the fit that answered (``model_fit.regimes``)
    # the fit's own figure in the limit's units, without its error: where ``upper_bytes`` is None
    # because the shape lies past capacity.max_extrapolation, a forward whose estimate alone is
    # over what is available is known not to fit (the fit never falls as a feature grows)
    estimate_bytes: int | None = None

    @property
    def peak_bytes(self) -> int | None:
        return self.peak_increase_bytes

    @property
    def varies(self) -> bool:
        return self.data_dependent

    def to_dict(self) -> dict[str, Any]:
        return {"features": self.features, "peak_increase_bytes": self.peak_increase_bytes,
                "error_ratio": self.error_ratio, "upper_bytes": self.upper_bytes,
                "extrapolates": self.extrapolates, "extrapolation": _finite(self.extrapolation),
                "extrapolation_factor": _finite_or_none(self.extrapolation_factor),
                "data_dependent": self.data_dependent, "shapes": self.shapes, "reason": self.reason,
                "repeat_ratio": self.repeat_ratio, "unit": self.unit, "gap_ratio": self.gap_ratio,
                "gap_bytes": self.gap_bytes, "regime": self.regime, "estimate_bytes": self.estimate_bytes}


def _finite_or_none(v: float) -> float | None:
    """JSON has no infinity: a factor past every finite one (a value of 0 below the smallest seen) is null."""
    return v if math.isfinite(v) else None


def _finite(d: Mapping[str, float]) -> dict[str, float | None]:
    return {k: _finite_or_none(v) for k, v in d.items()}


@dataclass(frozen=True)
class SafeLimit:
    """The largest value of one feature predicted to fit (a row of the max-safe-batch table).
    ``value`` None: not known (``reason``; ``at_least``: what is known to fit when the answer lies
    past ``capacity.max_extrapolation``)."""
    value: int | None
    extrapolation_factor: float | None  # of the shape at ``value`` (or at ``at_least``); None: no answer
    error_ratio: float | None           # the error the answer's shape carries
    reason: str | None = None
    at_least: int | None = None

    def to_dict(self) -> dict[str, Any]:
        f = self.extrapolation_factor
        return {"value": self.value, "extrapolation_factor": None if f is None else _finite_or_none(round(f, 3)),
                "error_ratio": self.error_ratio, "reason": self.reason, "at_least": self.at_least}


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
    # how much the error grows per multiple of the range seen an answer lies beyond: the worst
    # (error - error_ratio) / (factor - 1) of the held-out shapes outside the others' range, at
    # least GROWTH_FLOOR
    error_growth: float | None = None
    regime: str = PREFILL
    base: frozenset[str] = frozenset()  # the names a call of this kind gives (less the implied ones)

    def error_at(self, factor: float) -> float | None:
        """The error an answer this far outside the shapes seen carries (``factor`` 1.0: inside)."""
        if self.error_ratio is None:
            return None
        if factor <= 1.0:
            return self.error_ratio
        if not math.isfinite(factor):
            return math.inf
        far = self.extrapolation_error_ratio if self.extrapolation_error_ratio is not None else self.error_ratio
        grown = self.error_ratio + (self.error_growth or GROWTH_FLOOR) * (factor - 1.0)
        return round(max(grown, far), 4)

    def filled(self, features: Mapping[str, int]) -> dict[str, int]:
        """``features`` with the implied ones this kind of call has (cache_len 0, logits = seq_len)."""
        out = dict(features)
        for n in self.names - set(out):
            v = implied(n, out)
            if v is not None:
                out[n] = v
        return out


class MemoryModel:
    def __init__(self, max_shapes: int = 64, refit_interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 standard: bool = True) -> None:
        self.max_shapes = max_shapes
        self.standard = standard  # fed by the default shape_of: its names are known before any forward
        self.refit_interval_s = refit_interval_s
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._shapes: dict[Key, ShapeRecord] = {}
        # per kind of call: its shapes kept, and the range of each feature over every shape it kept
        # (worth_measuring; the range never shrinks: eviction keeps each feature's extremes anyway)
        self._family_n: dict[Family, int] = {}
        self._extent: dict[Family, dict[str, tuple[int, int]]] = {}
        self._version = 0
        self._fitted_version = -1
        self._fitted_at = -math.inf
        self._states: dict[str, FitState] = {}
        self._refitting = False
        self._last_refit_s = 0.0  # how long the last refit took (spaces the next one)
        self.background = True  # tests fit inline for determinism
        self.observed = 0
        self.mixed_features = 0  # forwards of a kind of call beyond MAX_FAMILIES (not modelled)
        self._bases: dict[frozenset, int] = {}  # names a kind of call gives -> its forwards
        self._names: frozenset[str] = frozenset()  # every name a kept call gave (implied ones included)

    # ---- writing ---------------------------------------------------------------------------
    def worth_measuring(self, features: Mapping[str, int]) -> bool:
        """Would measuring a forward of this shape teach the model: a shape not kept, whose kind of
        call has fewer than ``FEW_SHAPES`` kept or which lies outside the range its kind has seen
        in some feature (a larger batch, a longer context: what the answers would otherwise
        extrapolate to)? A shape between those seen adds little, and a generate() service brings a
        new one every decode step. Asked before a forward: dict lookups, no fit."""
        feats = canonical(features)
        if key_of(feats) in self._shapes:
            return False
        fam = family_of(feats)
        extent = self._extent.get(fam)
        if extent is None or self._family_n.get(fam, 0) < FEW_SHAPES:
            return True
        for name, v in feats.items():
            lo_hi = extent.get(name)
            if lo_hi is None or not lo_hi[0] <= v <= lo_hi[1]:
                return True
        return False

    def observe(self, features: Mapping[str, int], peak_increase: int, retained: int) -> None:
        if not features:
            return
        features = canonical(features)  # a prompt with an empty cache and one with none: one shape
        key = key_of(features)
        base = base_of(features)
        now = self._wall()
        with self._lock:
            if base not in self._bases and len(self._bases) >= MAX_FAMILIES:
                self.mixed_features += 1  # a fifth kind of call: counted, not modelled
                return
            self._bases[base] = self._bases.get(base, 0) + 1
            if not self._names.issuperset(features):
                self._names = self._names | frozenset(features)
            rec = self._shapes.get(key)
            if rec is None:
                fam = family_of(features)
                if len(self._shapes) >= self.max_shapes:
                    self._evict(fam)
                rec = self._shapes[key] = ShapeRecord(dict(features))
                self._family_n[fam] = self._family_n.get(fam, 0) + 1
                extent = self._extent.setdefault(fam, {})
                for n, v in features.items():
                    lo, hi = extent.get(n, (v, v))
                    extent[n] = (min(lo, v), max(hi, v))
            rec.peaks.append(max(0, int(peak_increase)))
            rec.retained.append(int(retained))
            rec.count += 1
            rec.last_seen = now
            self.observed += 1
            self._version += 1

    def _evict(self, incoming: Family) -> None:
        """Drop the least recently seen shape that holds no feature's minimum or maximum, from the
        kind of call with the most shapes (decode steps, one per context length, must not push out
        the prompts): the range the model can answer in survives any number of other shapes."""
        by_family: dict[Family, list[tuple[Key, ShapeRecord]]] = {}
        for kv in self._shapes.items():
            by_family.setdefault(family_of(kv[1].features), []).append(kv)
        by_family.setdefault(incoming, [])
        recs = max(by_family.values(), key=len)
        names = set().union(*(r.features for _, r in recs))
        hull = set()
        for n in names:
            having = [kv for kv in recs if n in kv[1].features]
            hull.add(min(having, key=lambda kv: kv[1].features[n])[0])
            hull.add(max(having, key=lambda kv: kv[1].features[n])[0])
        pool = [kv for kv in recs if kv[0] not in hull] or recs
        gone = min(pool, key=lambda kv: kv[1].last_seen)
        del self._shapes[gone[0]]
        fam = family_of(gone[1].features)
        self._family_n[fam] = self._family_n.get(fam, 1) - 1

    def clear(self) -> None:
        with self._lock:
            self._shapes.clear()
            self._bases.clear()
            self._family_n.clear()
            self._extent.clear()
            self._names = frozenset()
            self._version += 1

    def kinds(self) -> dict[frozenset, int]:
        """The names each kind of call gives (less the implied ones) -> its forwards."""
        with self._lock:
            return dict(self._bases)

    def kinds_note(self) -> str | None:
        """What to say where calls of one model give different names (each kind is learnt apart,
        and a question must give one kind's names); None where every call gives the same."""
        kinds = self.kinds()
        if len(kinds) < 2:
            return None
        parts = "; ".join(f"{names_text(b)} ({n} forward{'s' if n != 1 else ''})"
                          for b, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
        return (f"calls of this model give different features, each kind learnt apart: {parts}"
                + (f"; {self.mixed_features} forwards of further kinds not modelled" if self.mixed_features else ""))

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
            # no fit yet (one was made before the first forward, of nothing): the first is made
            # inline at once, so the answer after the first forward names it, as headroom() does
            due = force or not self._states or now - self._fitted_at >= max(self.refit_interval_s,
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
            for label, st in states.items():  # the same shape again can rise above its median
                ups = [above[k] for k, f, _, _ in recs if family_of(f) == (st.regime, st.base)]
                states[label] = dataclasses.replace(st, repeat_ratio=round(max(ups, default=0.0), 4))
            with self._lock:
                self._last_refit_s = time.perf_counter() - started
                if version >= self._fitted_version:
                    self._states, self._fitted_version = states, version
                return self._states
        finally:
            with self._lock:
                self._refitting = False

    def state(self, regime: str = PREFILL, force: bool = False) -> FitState:
        """The fit of ``regime``: a label of ``describe()["regimes"]`` ("prefill", "decode", or where
        calls give different names, "prefill [batch, rows]"), or a bare regime: its kind of call
        with the most forwards."""
        states = self.states(force)
        st = states.get(regime)
        if st is None:
            kinds = self.kinds()
            mine = [s for s in states.values() if s.regime == regime]
            st = max(mine, key=lambda s: kinds.get(s.base, 0), default=None)
        return st if st is not None else _fit_state([])

    def state_for(self, features: Mapping[str, int]) -> FitState | None:
        """The fit that answers for a shape (canonical features), None when that kind of call in
        that regime has no forward yet."""
        fam = family_of(features)
        return next((st for st in self.states().values() if (st.regime, st.base) == fam), None)

    def check(self, features: Mapping[str, int]) -> dict[str, int]:
        """``features`` as the model's calls give them (implied ones left out), or ShapeError naming
        a feature no call ever gave (a typo) or one the question left out. Before any forward, only
        a name the default features never give is refused (a ``shape_of``'s names are not known yet)."""
        feats = canonical(features)
        kinds = self.kinds()
        if not kinds:
            unknown = sorted(set(features) - STANDARD) if self.standard else []
            if unknown:
                raise ShapeError(f"unknown feature{'s' if len(unknown) > 1 else ''} {names_text(unknown)}: the "
                                 f"default features are {names_text(STANDARD - {LOGITS})} (a shape_of gives others)",
                                 tuple(unknown))
            return feats
        base = base_of(feats)
        known = self._names
        if self.standard and SEQ_LEN in known:
            known = known | OPTIONAL  # a model of token inputs: a cache or cut logits are questions it can hear
        if base in kinds and known.issuperset(features):
            return feats  # the common case, a few set operations (fits() is asked before every request)
        unknown = sorted(set(features) - known)
        if unknown:
            raise ShapeError(f"unknown feature{'s' if len(unknown) > 1 else ''} {names_text(unknown)}: "
                             f"{self.features_text(kinds)}", tuple(unknown))
        wider = sorted((b for b in kinds if base < b), key=lambda b: -kinds[b])
        if wider:
            missing = sorted(wider[0] - base)
            raise ShapeError(f"missing feature{'s' if len(missing) > 1 else ''} {names_text(missing)}: "
                             f"{self.features_text(kinds)}", tuple(missing))
        raise ShapeError(f"no call gave the features {names_text(base)} together: {self.features_text(kinds)}",
                         tuple(sorted(base)))

    def features_text(self, kinds: Mapping[frozenset, int] | None = None) -> str:
        """The names a question must give, for an error message."""
        kinds = self.kinds() if kinds is None else kinds
        opt = " (cache_len optional: 0, a prompt)" if self.standard and any(SEQ_LEN in b for b in kinds) else ""
        if len(kinds) == 1:
            return f"the model's features are {names_text(next(iter(kinds)))}{opt}"
        return ("calls of this model give different features: "
                + " or ".join(names_text(b) for b in sorted(kinds, key=lambda b: -kinds[b])) + opt)

    @property
    def error_ratio(self) -> float | None:
        """The worst leave-one-shape-out error over the regimes that answer."""
        errs = [st.error_ratio for st in self.states().values() if st.error_ratio is not None]
        return max(errs) if errs else None

    def predict(self, features: Mapping[str, int]) -> Prediction:
        """The answer for one shape (its names checked first: ``check`` raises ShapeError)."""
        asked = dict(features)
        feats = self.check(asked)
        st = self.state_for(feats)
        if st is None:
            why = ("no decode step (cache_len > 0) measured yet" if regime_of(feats) == DECODE and self.kinds()
                   else "no forward measured yet")
            return Prediction(asked, None, None, None, False, {}, False, 0, why)
        if st.fit is None or st.reason is not None:
            return Prediction(asked, None, None, None, False, {}, bool(st.varies), st.rows,
                              st.reason or "no fit", regime=_label(st, self.kinds()))
        filled = st.filled(feats)
        far = _extrapolation(filled, st.ranges)
        factor = extrapolation_factor(far)
        peak = max(0.0, st.fit.predict(filled))
        err = st.error_at(factor)
        up = st.repeat_ratio
        upper = (int(math.ceil(peak * (1 + err) * (1 + up))) if err is not None and math.isfinite(err) else None)
        why = None if upper is not None or err is None else "too far outside the shapes seen to bound its error"
        return Prediction(asked, int(round(peak)), err if err is None or math.isfinite(err) else None, upper,
                          bool(far), far, bool(st.varies), st.rows, why, repeat_ratio=up,
                          extrapolation_factor=round(factor, 3) if math.isfinite(factor) else factor,
                          regime=_label(st, self.kinds()))

    def largest_recent(self, since_unix: float) -> ShapeRecord | None:
        """The shape with the largest measured peak among those seen since ``since_unix``."""
        recent = [r for r in self.shapes() if r.last_seen >= since_unix]
        return max(recent, key=lambda r: r.peak) if recent else None

    def max_safe(self, available_bytes: float, fixed: Mapping[str, int], vary: str,
                 limit: int = 1 << 20, scale: float = 1.0, extra: float = 0.0,
                 max_extrapolation: float = math.inf) -> int | None:
        """``safe_limit``'s value: the largest ``vary`` that fits, None when not known."""
        return self.safe_limit(available_bytes, fixed, vary, limit, scale, extra, max_extrapolation).value

    def safe_limit(self, available_bytes: float, fixed: Mapping[str, int], vary: str,
                   limit: int = 1 << 20, scale: float = 1.0, extra: float = 0.0,
                   max_extrapolation: float = math.inf, state: FitState | None = None) -> SafeLimit:
        """The largest value of feature ``vary`` (others ``fixed``) whose predicted peak plus its
        error (grown with the distance outside the shapes seen, and the rise of repeats above their
        median; ``scale`` and ``extra``: a tensor figure's allowance for what the limit counts beyond
        it, as a factor and in bytes) fits in ``available_bytes``: 0 when not even 1 does. Not known
        (``value`` None, with the reason) when the model cannot answer, or the answer lies more than
        ``max_extrapolation`` times outside the shapes seen. The upper bound is non-decreasing in
        ``vary`` (the fit and the error both are), so a binary search is exact."""
        st = state if state is not None else self.state_for(canonical({**fixed, vary: 1}))
        if st is None or st.fit is None or st.reason is not None or st.error_ratio is None:
            return SafeLimit(None, None, None, (st.reason if st is not None and st.reason else "no fit yet"))
        if set(st.filled({**fixed, vary: 1})) != st.names:
            return SafeLimit(None, None, None, f"the fit's features are {names_text(st.names)}")
        fit_ = st.fit

        def factor(v: int) -> float:
            return extrapolation_factor(_extrapolation(st.filled({**fixed, vary: v}), st.ranges))

        def ok(v: int) -> bool:
            err = st.error_at(factor(v))
            if err is None or not math.isfinite(err):
                return False
            tensor_upper = fit_.predict(st.filled({**fixed, vary: v})) * (1 + err) * (1 + st.repeat_ratio)
            # never below the tensor figure's own upper bound, as predictions are not (service.predict)
            return max(tensor_upper, tensor_upper * scale + extra) <= available_bytes

        if factor(1) > max_extrapolation:
            worst = _worst(_extrapolation(st.filled({**fixed, vary: 1}), st.ranges))
            return SafeLimit(None, factor(1), None, f"{worst} is more than {max_extrapolation:g}x outside the "
                             "shapes seen (capacity.max_extrapolation): not known")
        # the largest value still within max_extrapolation of the shapes seen (factor is non-decreasing above the range)
        cap = limit
        if factor(cap) > max_extrapolation:
            while cap > 1 and factor(cap) > max_extrapolation:
                cap //= 2
            hi_cap = cap * 2
            while hi_cap - cap > 1:  # the exact cap, by bisection between a value inside and one past it
                mid = (cap + hi_cap) // 2
                cap, hi_cap = (mid, hi_cap) if factor(mid) <= max_extrapolation else (cap, mid)
        if not ok(1):
            return SafeLimit(0, factor(1), st.error_at(factor(1)))
        lo, hi = 1, 2
        while hi <= cap and ok(hi):
            lo, hi = hi, hi * 2
        hi = min(hi, cap + 1)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if ok(mid) else (lo, mid)
        f = factor(lo)
        if lo == cap and cap < limit and factor(cap + 1) > max_extrapolation:
            seen = st.ranges.get(vary, (0, 0))[1]
            return SafeLimit(None, f, st.error_at(f), f"not known: at least {lo} fits, and a larger {vary} lies more "
                             f"than {max_extrapolation:g}x outside the shapes seen (largest {vary} seen: {seen}; "
                             "capacity.max_extrapolation)", at_least=lo)
        return SafeLimit(lo, f, st.error_at(f))

    def describe(self) -> dict[str, Any]:
        states = self.states()
        kinds = self.kinds()
        return {"regimes": {label: {
                    "regime": st.regime, "features": sorted(st.names),
                    "shapes": st.rows, "more_shapes_needed": st.needed, "reason": st.reason,
                    "error_ratio": st.error_ratio, "extrapolation_error_ratio": st.extrapolation_error_ratio,
                    "error_growth": st.error_growth, "repeat_ratio": st.repeat_ratio,
                    "fit": st.fit.to_dict() if st.fit is not None else None,
                    "feature_ranges": {k: list(v) for k, v in sorted(st.ranges.items())},
                    "data_dependent_shapes": [dict(k) for k in st.varies]} for label, st in states.items()},
                "error_ratio": self.error_ratio,
                "features": sorted({n for r in self.shapes() for n in r.features}),
                "kinds_of_call": [{"features": sorted(b), "forwards": n}
                                  for b, n in sorted(kinds.items(), key=lambda kv: -kv[1])],
                "note": self.kinds_note(),
                "forwards_observed": self.observed, "forwards_with_other_features": self.mixed_features}


def _label(st: FitState, kinds: Mapping[frozenset, int]) -> str:
    """The regime's name in answers: bare where every call gives the same names."""
    return st.regime if len(kinds) < 2 else f"{st.regime} {names_text(st.base)}"


def _worst(far: Mapping[str, float]) -> str:
    n, v = max(far.items(), key=lambda kv: kv[1])
    return f"{n} at {v:g}x the range seen" if math.isfinite(v) else f"{n} 0"


LOSO_MAX = 48  # shapes held out in turn: a refit stays ~50 ms however long the table (decode steps)


def _held_out(rows: list[tuple[dict[str, int], float]]) -> list[int]:
    """Every row, or ``LOSO_MAX`` of them evenly spread over the range of peaks (both ends kept)."""
    if len(rows) <= LOSO_MAX:
        return list(range(len(rows)))
    order = sorted(range(len(rows)), key=lambda i: rows[i][1])
    step = (len(order) - 1) / (LOSO_MAX - 1)
    return sorted({order[round(k * step)] for k in range(LOSO_MAX)})


def _fit_states(recs: list[tuple[Key, dict[str, int], float, float]]) -> dict[str, FitState]:
    """One fit per kind of call and regime, keyed by its label (``_label``)."""
    by_family: dict[Family, list] = {}
    for rec in recs:
        by_family.setdefault(family_of(rec[1]), []).append(rec)
    bases = {b for _, b in by_family}
    out = {}
    for (regime, base), rs in sorted(by_family.items(), key=lambda kv: (kv[0][0], sorted(kv[0][1]))):
        st = dataclasses.replace(_fit_state(rs), regime=regime, base=base)
        out[regime if len(bases) < 2 else f"{regime} {names_text(base)}"] = st
    return out


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


def _fill(recs: list[tuple[Key, dict[str, int], float, float]]) -> list[tuple[Key, dict[str, int], float, float]]:
    """Each row with the implied features some rows of its kind give (a prompt's logits = seq_len)."""
    names = set().union(*(f for _, f, _, _ in recs))
    out = []
    for k, f, p, s in recs:
        g = dict(f)
        for n in names - set(g):
            v = implied(n, g)
            if v is not None:
                g[n] = v
        out.append((k, g, p, s))
    return out


def _fit_state(recs: list[tuple[Key, dict[str, int], float, float]]) -> FitState:
    if not recs:
        return FitState(None, frozenset(), 0, None, None, {}, {}, (), "no forward measured yet", 0)
    recs = _fill(recs)
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
        return FitState(model, names, len(rows), None, None, {}, ranges, varies,
                        _too_few(len(rows), need, reachable, constant), need)
    held = _held_out(rows)
    fitted = fit_with_errors(rows, terms, held)
    if fitted is None:
        return FitState(None, names, len(rows), None, None, {}, ranges, varies, "the fit failed", 1)
    model, errs = fitted
    errors = {key_of(rows[i][0]): e for i, e in zip(held, errs)}
    # A held-out shape outside the range of the others is an extrapolation: its error says how far
    # predictions outside the shapes seen can be trusted, not those inside (which are most asked),
    # and with how far out it lay, how fast that trust falls off
    inside, outside = [], []
    for i, e in zip(held, errs):
        f = rows[i][0]
        others = [g for j, (g, _) in enumerate(rows) if j != i]
        theirs = {n: (min(g[n] for g in others), max(g[n] for g in others)) for n in names}
        factor = extrapolation_factor(_extrapolation(f, theirs))
        if factor <= 1.0:
            inside.append(e)
        else:
            outside.append((factor, e))
    worst_in = max(inside) if inside else max(errs)
    worst_out = max([e for _, e in outside] + [worst_in])
    if not math.isfinite(worst_out):
        return FitState(model, names, len(rows), None, None, errors, ranges, varies,
                        "the fit failed on a shape left out", 0)
    growth = max([GROWTH_FLOOR] + [(e - worst_in) / (f - 1.0) for f, e in outside if math.isfinite(f)])
    return FitState(model, names, len(rows), round(worst_in, 4), round(worst_out, 4), errors, ranges, varies,
                    None, 0, error_growth=round(growth, 4))


def _too_few(seen: int, need: int, reachable: list[Term], constant: list[str]) -> str:
    """Why a table cannot answer yet: how many more shapes, and of what."""
    shapes = f"{seen} distinct shape{'s' if seen != 1 else ''} seen"
    if all(not t for t in reachable):  # nothing varied: only the constant term can be fitted
        return (f"{shapes}, all with the same {', '.join(constant)}: forwards of other sizes are needed "
                "(at least 2 more)")
    why = (f"{shapes}; {need} more needed to fit {', '.join(term_name(t) for t in reachable)} and measure "
           "its error on shapes left out")
    return why + (f" (only one value seen of: {', '.join(constant)})" if constant else "")
