"""Fitting a forward's peak to its shape: the model family, a weighted non-negative least-squares
fit, and its leave-one-shape-out error. Pure Python on a few dozen rows and at most a dozen
columns: a dependency (numpy/scipy) would cost every user an import for microseconds of work.

The family (``terms``). A transformer forward's transient peak is a sum of tensors whose sizes are
products of batch ``b``, sequence length ``s`` and, in a decode step, the cache length ``c``:
activations ``b*s*d``, eager attention scores ``b*h*s*(s+c)``, a KV cache ``b*(s+c)*d``; weights
and workspaces add a constant. So ``peak = k0 + k1*b + k2*b*s + k3*b*s^2 + k4*b*c + k5*b*s*c``
(plus ``k6*b*l`` where ``generate()`` computes the logits of ``l`` positions only) with every ``k >= 0``: SDPA / flash attention only make ``k3`` small. The non-negativity keeps
the fitted peak increasing in every feature, which the largest-safe-batch search relies on, and
stops two nearly collinear terms from cancelling out into nonsense outside the shapes seen.
Other feature sets (a user ``shape_of``) get a constant, each feature, and each pairwise product.

Rows are weighted by 1/peak, so the fit minimises relative error: the 5 % that matters on a small
shape is as important as on a large one. Terms a table cannot tell apart (every shape had the same
sequence length, say) are dropped before fitting, and the answer says what is missing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from .shapes import BATCH, CACHE_LEN, SEQ_LEN

Term = tuple[str, ...]  # a product of features (repeats are powers); () is the constant


def terms_for(names: Iterable[str]) -> list[Term]:
    """The model family for these feature names, simplest term first."""
    names = set(names)
    if BATCH in names:
        terms: list[Term] = [(), (BATCH,)]
        if SEQ_LEN in names:
            terms += [(BATCH, SEQ_LEN), (BATCH, SEQ_LEN, SEQ_LEN)]
        if CACHE_LEN in names:
            terms += [(BATCH, CACHE_LEN)]
            if SEQ_LEN in names:
                terms += [(BATCH, SEQ_LEN, CACHE_LEN)]
        # the language-model head: b * positions * vocabulary, all positions unless logits_to_keep cut them
        terms += [(BATCH, f) for f in sorted(names - {BATCH, SEQ_LEN, CACHE_LEN})]
        return terms
    ordered = sorted(names)
    return ([()] + [(f,) for f in ordered]
            + [(f, g) for i, f in enumerate(ordered) for g in ordered[i + 1:]])


def term_name(t: Term) -> str:
    if not t:
        return "1"
    parts = []
    for f in dict.fromkeys(t):
        n = t.count(f)
        parts.append(f if n == 1 else f"{f}^{n}")
    return "*".join(parts)


def term_value(t: Term, features: Mapping[str, int]) -> float:
    v = 1.0
    for f in t:
        v *= features.get(f, 0)
    return v


@dataclass(frozen=True)
class Fit:
    terms: tuple[Term, ...]
    coefficients: tuple[float, ...]
    dropped: tuple[Term, ...]  # terms the shapes could not identify
    rank: int = 0              # how many terms the shapes identify

    def predict(self, features: Mapping[str, int]) -> float:
        return sum(k * term_value(t, features) for t, k in zip(self.terms, self.coefficients))

    def to_dict(self) -> dict[str, object]:
        return {"terms": {term_name(t): k for t, k in zip(self.terms, self.coefficients) if k > 0},
                "unidentified_terms": [term_name(t) for t in self.dropped]}


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) < 1e-12:
            return None
        m[c], m[p] = m[p], m[c]
        for r in range(c + 1, n):
            f = m[r][c] / m[c][c]
            if f:
                for k in range(c, n + 1):
                    m[r][k] -= f * m[c][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))) / m[r][r]
    return x


def _lstsq(cols: Sequence[list[float]], y: list[float], idx: list[int]) -> list[float] | None:
    """Least squares on the columns ``idx`` (normal equations: the columns are scaled to unit
    norm by the caller and there are at most a dozen)."""
    g = [[sum(a * b for a, b in zip(cols[i], cols[j])) for j in idx] for i in idx]
    r = [sum(a * b for a, b in zip(cols[i], y)) for i in idx]
    return _solve(g, r)


def nnls(cols: Sequence[list[float]], y: list[float], max_iter: int = 100) -> list[float]:
    """Lawson-Hanson non-negative least squares over column vectors ``cols``."""
    n = len(cols)
    x = [0.0] * n
    passive: list[int] = []
    spanned: set[int] = set()  # columns in the span of the passive ones when tried: they add nothing
    for _ in range(max_iter):
        resid = [yi - sum(x[j] * cols[j][i] for j in range(n)) for i, yi in enumerate(y)]
        w = [sum(c * r for c, r in zip(cols[j], resid)) for j in range(n)]
        cand = [j for j in range(n) if j not in passive and j not in spanned and w[j] > 1e-12]
        if not cand:
            break
        passive.append(max(cand, key=lambda j: w[j]))
        while True:
            z = _lstsq(cols, y, passive)
            if z is None:
                spanned.add(passive.pop())
                break
            if all(v > 0 for v in z):
                for j, v in zip(passive, z):
                    x[j] = v
                break
            alpha = min(x[j] / (x[j] - v) for j, v in zip(passive, z) if v <= 0)
            for j, v in zip(passive, z):
                x[j] += alpha * (v - x[j])
            passive = [j for j in passive if x[j] > 1e-15]
            for j in range(n):
                if j not in passive:
                    x[j] = 0.0
    return x


def _identifiable(cols: list[list[float]]) -> list[int]:
    """Indices of columns, simplest first, each not (numerically) in the span of those kept
    before it: Gram-Schmidt on unit columns."""
    basis: list[list[float]] = []
    kept = []
    for j, c in enumerate(cols):
        v = c[:]
        for q in basis:
            d = sum(a * b for a, b in zip(v, q))
            v = [a - d * b for a, b in zip(v, q)]
        norm = math.sqrt(sum(a * a for a in v))
        if norm > 1e-6:
            basis.append([a / norm for a in v])
            kept.append(j)
    return kept


def fit(rows: Sequence[tuple[Mapping[str, int], float]], terms: Sequence[Term]) -> Fit | None:
    """Weighted NNLS of peak on ``terms`` over (features, peak) rows; None with no usable row."""
    rows = [(f, y) for f, y in rows if y > 0]
    if not rows:
        return None
    w = [1.0 / y for _, y in rows]
    raw = [[term_value(t, f) * wi for (f, _), wi in zip(rows, w)] for t in terms]
    scale = [math.sqrt(sum(v * v for v in c)) or 1.0 for c in raw]
    unit = [[v / s for v in c] for c, s in zip(raw, scale)]
    # Which terms these shapes can tell apart is reported (and sizes how many shapes are needed),
    # but NNLS chooses among all of them: of two collinear sets (b*s and b*s^2 against b, on two
    # sequence lengths), the first by simplicity may need a negative coefficient where the other
    # fits exactly with positive ones (an encoder's attention phase: b*(2560*s + 32*s^2))
    keep = _identifiable(unit)
    x = nnls(unit, [1.0] * len(rows))  # y * w == 1
    used = [j for j in range(len(terms)) if x[j] > 0 or j in keep]
    return Fit(tuple(terms[j] for j in used), tuple(x[j] / scale[j] for j in used),
               tuple(t for j, t in enumerate(terms) if j not in keep), rank=len(keep))


def leave_one_out(rows: Sequence[tuple[Mapping[str, int], float]], terms: Sequence[Term],
                  held_out: Sequence[int] | None = None) -> list[float]:
    """Relative error on each held-out row (all by default) of a fit on all the other rows."""
    errors = []
    for i in (range(len(rows)) if held_out is None else held_out):
        f, y = rows[i]
        rest = [r for j, r in enumerate(rows) if j != i]
        m = fit(rest, terms)
        errors.append(abs(m.predict(f) - y) / y if m is not None and y > 0 else math.inf)
    return errors


# ---- two pieces: the peak of a forward whose largest phase changes with the shape --------------
# A forward's peak is the largest of its phases' (an encoder layer's attention scores, b*h*s^2,
# against its feed-forward's b*s*4d), so it has a kink where the phases cross (BERT eager,
# measured: b*max(5632*s + 16*s^2, 2560*s + 32*s^2), crossing at s = 192): one polynomial across
# it is off by ~8 %. Two fits, one each side of a split along one feature, are exact on their
# sides. Past the low side's largest value seen, the answer is the larger of the two: between the
# sides nobody knows where the kink lies, and the larger is the safe side of that ignorance (and
# keeps the answer non-decreasing). The low side's fit is never applied where it was not fitted
# from above: a high side's fit from two sequence lengths can be far too high at small ones.
TWO_PIECES_ABOVE = 0.02  # a single fit this good on shapes left out needs no second piece
SPLITS_PER_FEATURE = 8   # thresholds tried per feature (quantiles): the fit stays ~0.1 s


@dataclass(frozen=True)
class SplitFit:
    feature: str
    low_max: int  # the largest value of ``feature`` the low piece was fitted on
    low: Fit
    high: Fit

    @property
    def terms(self) -> tuple[Term, ...]:
        return self.low.terms

    @property
    def dropped(self) -> tuple[Term, ...]:
        return self.low.dropped

    @property
    def rank(self) -> int:
        return self.low.rank

    def predict(self, features: Mapping[str, int]) -> float:
        lo = self.low.predict(features)
        return lo if features.get(self.feature, 0) <= self.low_max else max(lo, self.high.predict(features))

    def to_dict(self) -> dict[str, object]:
        return {"split": {"feature": self.feature, "low_up_to": self.low_max},
                "low": self.low.to_dict(), "high": self.high.to_dict()}


def _sq_rel(model: Fit | SplitFit, rows: Sequence[tuple[Mapping[str, int], float]]) -> float:
    return sum((model.predict(f) / y - 1) ** 2 for f, y in rows)


def _thresholds(values: list[int]) -> list[float]:
    u = sorted(set(values))
    mids = [(a + b) / 2 for a, b in zip(u, u[1:])]
    if len(mids) <= SPLITS_PER_FEATURE:
        return mids
    step = (len(mids) - 1) / (SPLITS_PER_FEATURE - 1)
    return [mids[round(k * step)] for k in range(SPLITS_PER_FEATURE)]


def _split(rows: Sequence[tuple[Mapping[str, int], float]], side: list[int], name: str,
           terms: Sequence[Term], min_rows: int) -> SplitFit | None:
    groups = [[r for r, g in zip(rows, side) if g == k] for k in (0, 1)]
    if min(len(g) for g in groups) < min_rows:
        return None
    low, high = fit(groups[0], terms), fit(groups[1], terms)
    if low is None or high is None:
        return None
    return SplitFit(name, max(f[name] for f, _ in groups[0]), low, high)


def _two_pieces(rows: Sequence[tuple[Mapping[str, int], float]], terms: Sequence[Term],
                min_rows: int) -> tuple[SplitFit, str, float] | None:
    """The best split of the rows along one feature: (fit, feature, threshold)."""
    best: tuple[float, SplitFit, str, float] | None = None
    for name in sorted(rows[0][0]):
        for thr in _thresholds([f[name] for f, _ in rows]):
            m = _split(rows, [int(f[name] > thr) for f, _ in rows], name, terms, min_rows)
            if m is None:
                continue
            score = _sq_rel(m, rows)
            if best is None or score < best[0]:
                best = (score, m, name, thr)
    return None if best is None else (best[1], best[2], best[3])


def fit_with_errors(rows: Sequence[tuple[Mapping[str, int], float]], terms: Sequence[Term],
                    held_out: Sequence[int]) -> tuple[Fit | SplitFit, list[float]] | None:
    """The fit a table of shapes gets, and its leave-one-out errors on ``held_out``: one member of
    the family, or the max of two when that is better on the shapes left out."""
    one = fit(rows, terms)
    if one is None:
        return None
    errs = leave_one_out(rows, terms, held_out)
    min_rows = one.rank + 1
    if max(errs, default=0.0) <= TWO_PIECES_ABOVE or len(rows) < 2 * min_rows:
        return one, errs
    found = _two_pieces(rows, terms, min_rows)
    if found is None:
        return one, errs
    two, name, thr = found
    errs2 = []
    for i in held_out:  # the split stays: each side refitted without the held-out row
        f, y = rows[i]
        rest = [r for j, r in enumerate(rows) if j != i]
        m = _split(rest, [int(g[name] > thr) for g, _ in rest], name, terms, min_rows - 1)
        errs2.append(abs(m.predict(f) - y) / y if m is not None else math.inf)
    if max(errs2, default=math.inf) < max(errs):
        return two, errs2
    return one, errs
