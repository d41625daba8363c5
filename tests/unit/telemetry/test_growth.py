"""Growth detection on synthetic memory series: leaks are flagged, healthy shapes are not.

Each series is generated here from its own arithmetic (a leak of so many bytes per reading, a
sawtooth of a known period, a step...); the detector sees only (time, value) readings. The Theil-Sen
fit is checked against the estimator's definition written out in the test and its confidence
interval by its coverage over many noisy draws.
"""
from __future__ import annotations

import random
import statistics

import pytest

from memprof_otel.telemetry.growth import CONFIRM, MIN_POINTS, GrowthDetector, GrowthParams, fit, theil_sen

MiB = 1 << 20
# one reading per second; floors of 10 s; a 5-minute window; 60 s warm-up; flag at 1 KiB/s, 4 MiB
P = GrowthParams(floor_interval=10.0, trend_window=300.0, warmup=60.0, min_growth_rate=1024.0,
                 min_growth_bytes=4 * MiB, confidence=0.999)
BASE = 2_000 * MiB


def run(values: list[float], params: GrowthParams = P, dt: float = 1.0) -> list[bool]:
    """Feed one reading per ``dt`` seconds; the suspect flag after each reading."""
    d = GrowthDetector(params)
    flags = []
    for i, v in enumerate(values):
        tr = d.observe("s", 1_000.0 + i * dt, v)
        flags.append(bool(tr is not None and tr.suspected))
    return flags


# ---- the estimator ---------------------------------------------------------------------------

def test_theil_sen_is_the_median_of_pairwise_slopes_and_ignores_outliers():
    rng = random.Random(1)
    pts = [(float(i), 3.0 * i + rng.uniform(-1, 1)) for i in range(15)]
    pts[4] = (4.0, 1e9)  # one wild reading
    pts[11] = (11.0, -1e9)
    pairs = [(yj - yi) / (xj - xi) for i, (xi, yi) in enumerate(pts) for (xj, yj) in pts[i + 1:]]
    slope, low, high = theil_sen(pts)
    assert slope == pytest.approx(statistics.median(pairs))
    assert 2.5 < low <= slope <= high < 3.5  # least squares would be thrown off by 1e9


def test_theil_sen_interval_covers_the_true_slope_about_as_often_as_claimed():
    rng = random.Random(7)
    true = 50.0
    hits = 0
    trials = 300
    for _ in range(trials):
        pts = [(float(i), true * i + rng.gauss(0, 400.0)) for i in range(20)]
        _, low, high = theil_sen(pts, 0.95)
        hits += low <= true <= high
    assert 0.90 * trials <= hits <= 0.995 * trials, hits


def test_theil_sen_refuses_too_few_points():
    with pytest.raises(ValueError):
        theil_sen([(0.0, 1.0)])
    with pytest.raises(ValueError):
        theil_sen([(1.0, 1.0), (1.0, 2.0)])


def test_no_trend_before_min_points():
    floors = [(float(i), float(i * MiB)) for i in range(MIN_POINTS - 1)]
    assert fit(floors, P) is None
    tr = fit(floors + [(float(MIN_POINTS), float(MIN_POINTS * MiB))], P)
    assert tr is not None and tr.slope == pytest.approx(MiB)


# ---- leaks are flagged -----------------------------------------------------------------------

def test_staircase_leak_is_flagged_after_warmup_and_not_before():
    # 1 MiB every 10 readings (1 MiB per 100 forwards at 10 forwards a reading): 100 KiB/s
    values = [BASE + (i // 10) * MiB for i in range(600)]
    flags = run(values)
    first = flags.index(True)
    assert first >= 60 + (MIN_POINTS + CONFIRM - 1) * 10, "flagged during warm-up or before enough floors"
    assert first <= 60 + (MIN_POINTS + CONFIRM + 1) * 10, f"flagged only at reading {first}"
    assert all(flags[first:])


def test_noisy_leak_is_flagged():
    # 40 KiB/s under +-8 MiB of noise per reading, and spikes of +200 MiB now and then
    rng = random.Random(3)
    values = [BASE + 40 * 1024 * i + rng.uniform(-8, 8) * MiB + (200 * MiB if rng.random() < 0.03 else 0)
              for i in range(900)]
    flags = run(values)
    assert any(flags[:400]), "a steady 40 KiB/s leak under noise was not flagged within 400 s"
    assert all(flags[600:])


def test_leak_under_a_sawtooth_is_flagged():
    # a per-request cache of 300 MiB filled over 20 s then dropped, on a floor leaking 30 KiB/s
    values = [BASE + 30 * 1024 * i + (i % 20) * 15 * MiB for i in range(900)]
    flags = run(values, GrowthParams(**{**P.__dict__, "floor_interval": 30.0, "trend_window": 600.0}))
    assert flags[-1]


# ---- healthy shapes are not ------------------------------------------------------------------

def test_steady_sawtooth_is_not_flagged():
    # KV cache: grows 8 MiB a reading over a 25-reading request, dropped at its end
    values = [BASE + (i % 25) * 8 * MiB for i in range(2000)]
    assert not any(run(values, GrowthParams(**{**P.__dict__, "floor_interval": 30.0})))


def test_sawtooth_with_jittered_request_lengths_is_not_flagged():
    rng = random.Random(5)
    values, level, left = [], 0, 0
    for _ in range(2000):
        if left == 0:
            level, left = 0, rng.randint(5, 25)
        values.append(BASE + level)
        level += rng.randint(1, 12) * MiB
        left -= 1
    assert not any(run(values, GrowthParams(**{**P.__dict__, "floor_interval": 30.0})))


def test_plateau_after_warmup_is_not_flagged():
    # an allocator cache that fills once, 500 MiB at once, in the middle of the watched period
    values = [BASE + (500 * MiB if i >= 400 else 0) for i in range(1200)]
    assert not any(run(values))


def test_warmup_ramp_then_flat_is_not_flagged():
    # 60 s of steep start-up growth (20 MiB/s), flat afterwards
    values = [BASE + min(i, 60) * 20 * MiB for i in range(1200)]
    assert not any(run(values))


def test_ramp_that_plateaus_is_flagged_only_while_it_grows():
    # lazy init growing 100 KiB/s for 4 minutes after warm-up, then flat for good
    values = [BASE + min(max(i - 60, 0), 240) * 100 * 1024 for i in range(1500)]
    flags = run(values)
    assert any(flags[:300])  # it did grow, significantly, for minutes
    assert not any(flags[-300:]), "still flagged long after the growth stopped"


def test_slow_growth_under_the_thresholds_is_not_flagged():
    # 512 B/s: the slope is significant but below min_growth_rate
    values = [BASE + 512 * i for i in range(1200)]
    assert not any(run(values))
    # fast enough but a short window: the total growth stays under min_growth_bytes
    p = GrowthParams(**{**P.__dict__, "min_growth_bytes": 1 << 30})
    assert not any(run([BASE + 100 * 1024 * i for i in range(1200)], p))


@pytest.mark.parametrize("seed", range(5))
def test_noise_without_trend_is_not_flagged(seed: int):
    # floors that wander by tens of MiB, far more than min_growth_bytes, and no trend
    rng = random.Random(seed)
    values = [BASE + rng.gauss(0, 50) * MiB for i in range(3000)]
    assert not any(run(values))


# ---- bookkeeping -----------------------------------------------------------------------------

def test_window_reported_is_the_span_of_the_floors_fitted():
    d = GrowthDetector(P)
    for i in range(1000):
        d.observe("s", 1_000.0 + i, BASE + 1024.0 * i)
    tr = d.trends()["s"]
    assert tr.points == 30  # 300 s / 10 s
    assert tr.end - tr.start == pytest.approx(290.0)
    assert tr.slope == pytest.approx(1024.0)
    assert tr.growth == pytest.approx(1024.0 * 290.0)
    assert tr.end <= 1_999.0 and tr.start >= 1_000.0 + 60.0


def test_observe_all_forgets_series_that_are_gone():
    d = GrowthDetector(P)
    for i in range(200):
        d.observe_all(float(i), {"a": 1.0 * i, "b": 2.0 * i})
    assert set(d.trends()) == {"a", "b"}
    d.observe_all(200.0, {"a": 200.0})
    assert set(d.keys()) == {"a"} and set(d.trends()) == {"a"}


def test_readings_out_of_order_or_not_finite_are_left_out():
    d = GrowthDetector(P)
    for i in range(200):
        d.observe("s", float(i), float(i))
    before = d.trends()["s"]
    d.observe("s", 5.0, -1e12)  # from the past
    d.observe("s", 201.0, float("nan"))
    assert d.trends()["s"] == before


@pytest.mark.parametrize("kw", [{"floor_interval": 0.0}, {"trend_window": -1.0}, {"warmup": -1.0},
                                {"confidence": 1.0}, {"confidence": 0.1}])
def test_bad_params_are_refused(kw):
    with pytest.raises(ValueError):
        GrowthParams(**{**P.__dict__, **kw})
