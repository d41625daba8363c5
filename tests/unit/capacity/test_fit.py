"""The fit: NNLS against known coefficients, terms the data cannot identify, leave-one-out."""
from __future__ import annotations

import random

import pytest

from memprof_otel.capacity.fit import fit, leave_one_out, nnls, term_name, terms_for


def _rows(fn, shapes):
    return [({"batch": b, "seq_len": s}, fn(b, s)) for b, s in shapes]


GRID = [(b, s) for b in (1, 2, 4, 8) for s in (16, 64, 128, 512)]


def test_recovers_known_coefficients_of_the_transformer_family():
    rows = _rows(lambda b, s: 5e6 + 3e4 * b + 7e3 * b * s + 40 * b * s * s, GRID)
    m = fit(rows, terms_for({"batch", "seq_len"}))
    got = dict(zip(map(term_name, m.terms), m.coefficients))
    assert got == pytest.approx({"1": 5e6, "batch": 3e4, "batch*seq_len": 7e3, "batch*seq_len^2": 40}, rel=1e-6)
    assert max(leave_one_out(rows, list(m.terms))) < 1e-9


def test_coefficients_never_negative_so_the_fit_grows_with_every_feature():
    # a peak that falls with batch cannot be fitted by non-negative terms: the fit must not invent
    # a negative coefficient (which would make max-safe-batch searches non-monotone)
    rows = _rows(lambda b, s: 1e7 - 1e5 * b + 10 * b * s, GRID)
    m = fit(rows, terms_for({"batch", "seq_len"}))
    assert all(k >= 0 for k in m.coefficients)
    preds = [m.predict({"batch": b, "seq_len": 128}) for b in range(1, 64)]
    assert preds == sorted(preds)


def test_terms_a_constant_feature_cannot_identify_are_dropped_and_named():
    rows = _rows(lambda b, s: 1e6 + 5e3 * b * s, [(b, 128) for b in (1, 2, 3, 4)])
    m = fit(rows, terms_for({"batch", "seq_len"}))
    assert [term_name(t) for t in m.dropped] == ["batch*seq_len", "batch*seq_len^2"]
    assert m.predict({"batch": 6, "seq_len": 128}) == pytest.approx(1e6 + 5e3 * 6 * 128)


def test_weighted_by_relative_error_so_small_shapes_count():
    random.seed(3)
    truth = lambda b, s: 2e5 + 1e3 * b * s  # noqa: E731
    rows = [(f, y * (1 + random.uniform(-0.01, 0.01))) for f, y in _rows(truth, GRID)]
    m = fit(rows, terms_for({"batch", "seq_len"}))
    for b, s in GRID:
        assert abs(m.predict({"batch": b, "seq_len": s}) / truth(b, s) - 1) < 0.03


def test_nnls_matches_a_brute_force_check_on_a_small_problem():
    cols = [[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]
    y = [1.0, -1.0, 0.5]
    x = nnls(cols, y)
    assert x[1] == 0.0 and x[0] > 0
    best = min(((a / 1000, ((a / 1000 - 1) ** 2 + 1 + (a / 1000 - 0.5) ** 2)) for a in range(0, 2000)),
               key=lambda p: p[1])[0]
    assert x[0] == pytest.approx(best, abs=1e-3)


def test_other_feature_sets_get_linear_and_pairwise_terms():
    assert [term_name(t) for t in terms_for({"tokens", "images"})] == ["1", "images", "tokens", "images*tokens"]
    assert [term_name(t) for t in terms_for({"batch", "seq_len", "cache_len"})] == [
        "1", "batch", "batch*seq_len", "batch*seq_len^2", "batch*cache_len", "batch*seq_len*cache_len"]
