"""The memory model's table and answers: when it can answer, how it says when it cannot."""
from __future__ import annotations

import threading

import pytest

from memprof_otel.capacity.model import MemoryModel
from memprof_otel.errors import ShapeError


def peak(b: int, s: int) -> int:
    return 1_000_000 + 4_000 * b * s + 30 * b * s * s


def trained(shapes, **kw) -> MemoryModel:
    m = MemoryModel(refit_interval_s=0, **kw)
    m.background = False
    for b, s in shapes:
        m.observe({"batch": b, "seq_len": s}, peak(b, s), 100 * b * s)
    return m


GRID = [(b, s) for b in (1, 2, 4, 8) for s in (32, 128, 256)]


def test_predicts_an_unseen_shape_inside_the_range_and_says_it_does_not_extrapolate():
    m = trained(GRID)
    p = m.predict({"batch": 3, "seq_len": 200})
    assert p.reason is None and p.peak_bytes == pytest.approx(peak(3, 200), rel=1e-6)
    assert not p.extrapolates and p.extrapolation == {}
    assert p.error_ratio is not None and p.error_ratio < 1e-6
    assert p.upper_bytes >= p.peak_bytes


def test_flags_extrapolation_with_how_far():
    p = trained(GRID).predict({"batch": 32, "seq_len": 64})
    assert p.extrapolates and p.extrapolation == {"batch": 4.0}
    p = trained(GRID).predict({"batch": 2, "seq_len": 8})
    assert p.extrapolation == {"seq_len": 4.0}


def test_too_few_shapes_says_how_many_more_are_needed():
    m = trained([(1, 32), (2, 128)])
    p = m.predict({"batch": 2, "seq_len": 32})
    assert p.peak_bytes is None
    assert "2 distinct shapes seen; 3 more needed" in p.reason
    st = m.state()
    assert st.needed == 3
    assert MemoryModel().predict({"batch": 1}).reason == "no forward measured yet"


def test_a_feature_never_varied_is_named_in_the_reason():
    m = trained([(1, 128), (2, 128)])
    assert "only one value seen of: seq_len" in m.predict({"batch": 4, "seq_len": 128}).reason


def test_unknown_or_missing_features_are_a_shape_error_naming_them():
    m = trained(GRID)
    with pytest.raises(ShapeError, match=r"missing feature \[seq_len\]") as e:
        m.predict({"batch": 3})
    assert e.value.features == ("seq_len",)
    with pytest.raises(ShapeError, match=r"unknown feature \[images\].*\[batch, seq_len\]"):
        m.predict({"batch": 3, "seq_len": 4, "images": 2})
    with pytest.raises(ShapeError, match=r"unknown feature \[seqlen\]"):  # a typo, before any forward too
        MemoryModel().predict({"batch": 3, "seqlen": 4})


def test_same_shape_very_different_peaks_is_flagged_data_dependent():
    m = trained(GRID)
    for v in (1e6, 5e6, 1e6, 9e6):
        m.observe({"batch": 1, "seq_len": 32}, int(v), 0)
    p = m.predict({"batch": 2, "seq_len": 64})
    assert p.varies
    assert m.describe()["regimes"]["prefill"]["data_dependent_shapes"] == [{"batch": 1, "seq_len": 32}]


def test_one_outlier_forward_does_not_move_a_shape_s_figure():
    m = trained(GRID)
    m.observe({"batch": 4, "seq_len": 128}, peak(4, 128) * 10, 0)  # e.g. a GC pause's garbage
    m.observe({"batch": 4, "seq_len": 128}, peak(4, 128), 0)
    assert m.predict({"batch": 4, "seq_len": 128}).peak_bytes == pytest.approx(peak(4, 128), rel=1e-6)


def test_bounded_table_keeps_the_extremes():
    m = trained([(1, 32), (64, 32), (1, 1024)] + [(b, s) for b in range(2, 9) for s in (40, 50, 60)], max_shapes=8)
    seen = {tuple(sorted(r.features.items())) for r in m.shapes()}
    assert len(seen) == 8
    assert (("batch", 64), ("seq_len", 32)) in seen and (("batch", 1), ("seq_len", 1024)) in seen
    assert m.predict({"batch": 32, "seq_len": 512}).extrapolates is False


def test_max_safe_equals_a_brute_force_search():
    """The search against plain arithmetic: each batch's peak times (1 + the error at its distance
    outside the batches seen, 1..8), the fit exact on this family."""
    m = trained(GRID)
    st = m.state()
    for avail in (2e6, 5e7, 3e8):
        for s in (32, 128, 256):
            brute = 0
            while peak(brute + 1, s) * (1 + st.error_at(max(1.0, (brute + 1) / 8))) <= avail:
                brute += 1
            assert m.max_safe(avail, {"seq_len": s}, "batch") == brute
    assert m.max_safe(10, {"seq_len": 32}, "batch") == 0


def test_prompts_and_decode_steps_are_fitted_apart():
    m = MemoryModel(refit_interval_s=0)
    m.background = False
    for b in (1, 2, 4, 8):
        for s in (16, 64, 128):
            m.observe({"batch": b, "seq_len": s, "cache_len": 0}, 10_000 * b * s + 5 * b * s * s, 0)
        for c in (16, 64, 200, 400):
            m.observe({"batch": b, "seq_len": 1, "cache_len": c}, 50_000 * b + 300 * b * c, 0)
    assert set(m.describe()["regimes"]) == {"prefill", "decode"}
    assert m.predict({"batch": 3, "seq_len": 1, "cache_len": 300}).peak_bytes == pytest.approx(
        50_000 * 3 + 300 * 3 * 300, rel=1e-6)
    assert m.predict({"batch": 3, "seq_len": 100, "cache_len": 0}).peak_bytes == pytest.approx(
        10_000 * 300 + 5 * 3 * 100 * 100, rel=1e-6)


def test_calls_with_other_features_are_learnt_apart_and_a_fifth_kind_counted():
    m = trained(GRID)
    for t in (1, 2, 4, 8, 16, 32):
        m.observe({"tokens": t}, 1000 + 50 * t, 0)
    assert len(m.shapes()) == len(GRID) + 6 and m.mixed_features == 0
    assert m.predict({"tokens": 10}).peak_bytes == pytest.approx(1500, rel=1e-3)
    assert m.predict({"batch": 3, "seq_len": 200}).peak_bytes == pytest.approx(peak(3, 200), rel=1e-6)
    assert "[batch, seq_len] (12 forwards); [tokens] (6 forwards)" in m.kinds_note()
    assert set(m.describe()["regimes"]) == {"prefill [batch, seq_len]", "prefill [tokens]"}
    with pytest.raises(ShapeError, match=r"no call gave the features \[seq_len, tokens\] together"):
        m.predict({"tokens": 3, "seq_len": 2})
    for i, name in enumerate(("a", "b", "c")):
        m.observe({name: 1}, 100, 0)
    assert m.mixed_features == 1  # four kinds kept; the fifth counted, not modelled


def test_readers_never_wait_for_a_refit_once_a_fit_exists():
    m = trained(GRID)
    m.states()  # the first fit, inline
    m._last_refit_s = 0.0  # due again at once (refits are spaced by their own cost)
    m.background = True
    m.observe({"batch": 16, "seq_len": 256}, peak(16, 256), 0)
    started = threading.Event()
    release = threading.Event()
    import memprof_otel.capacity.model as mod
    real = mod._fit_states

    def slow(recs):
        started.set()
        release.wait(5)
        return real(recs)

    mod._fit_states = slow
    try:
        before = m.states()  # kicks the background refit, answers with the old fit at once
        assert started.wait(5)
        assert m.predict({"batch": 16, "seq_len": 256}).extrapolates  # the old fit: batch 16 unseen
        release.set()
        for _ in range(500):
            if m.states() is not before:
                break
            threading.Event().wait(0.01)
        assert not m.predict({"batch": 16, "seq_len": 256}).extrapolates
    finally:
        mod._fit_states = real
        release.set()


def test_refits_are_spaced_by_their_own_cost():
    """A refit that took 50 ms is not repeated within 5 s (1 % of a core), however the table changes."""
    now = [0.0]
    m = MemoryModel(refit_interval_s=1.0, clock=lambda: now[0])
    m.background = False
    for b, s in GRID:
        m.observe({"batch": b, "seq_len": s}, peak(b, s), 0)
    first = m.states()
    m._last_refit_s = 0.05
    m.observe({"batch": 16, "seq_len": 32}, peak(16, 32), 0)
    now[0] = 2.0
    assert m.states() is first  # due after 1 s by the interval, but not by its cost
    now[0] = 5.1
    assert m.states() is not first


def test_a_shape_is_worth_measuring_while_its_kind_has_few_or_it_extends_their_range() -> None:
    """What the learning budget spends attributed forwards on: any new shape of a kind of call with
    fewer than 8 kept, then only those outside the range seen (a generate() service brings a new
    decode shape every step; the one between two seen teaches the fit little)."""
    from memprof_otel.capacity.model import FEW_SHAPES
    m = MemoryModel(refit_interval_s=0)
    m.background = False
    seen = [(b, s) for b in (1, 4) for s in (16, 32, 64, 128)]
    assert len(seen) == FEW_SHAPES
    for b, s in seen[:-1]:
        m.observe({"batch": b, "seq_len": s}, 1000 * b * s, 0)
    assert m.worth_measuring({"batch": 2, "seq_len": 48})  # 7 kept: any new shape
    m.observe({"batch": seen[-1][0], "seq_len": seen[-1][1]}, 1000, 0)
    assert not m.worth_measuring({"batch": 4, "seq_len": 128})  # measured
    assert not m.worth_measuring({"batch": 2, "seq_len": 48})  # inside the range, 8 kept
    assert m.worth_measuring({"batch": 8, "seq_len": 48})  # a larger batch than any seen
    assert m.worth_measuring({"batch": 2, "seq_len": 256})  # a longer sequence
    # decode steps are another kind: their first shapes are worth it whatever the prompts hold
    assert m.worth_measuring({"batch": 2, "seq_len": 1, "cache_len": 40})
    assert not m.worth_measuring({"batch": 2, "seq_len": 48, "cache_len": 0})  # a prompt, canonical


def test_the_first_forward_is_named_at_once_even_when_a_fit_of_nothing_was_asked_for_before_it():
    # GIVEN a model that refits at most once a minute, asked before any forward (a scrape, a tick)
    m = MemoryModel(refit_interval_s=60.0)
    assert m.states() == {}
    # WHEN the first forward is measured
    m.observe({"batch": 2, "seq_len": 16}, 65536, 8704)
    # THEN the next answer names it (as headroom's table does), not "no forward measured yet"
    reason = m.predict({"batch": 2, "seq_len": 16}).reason
    assert reason is not None and "1 distinct shape seen" in reason, reason
