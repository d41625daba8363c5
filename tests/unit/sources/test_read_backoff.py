"""The back-off shared by the sources whose read is expensive (glibc's mallinfo2, CPython's arena
statistics), on an injected clock: the wait follows the measured cost, never drops under the base,
and a read that raises leaves the history as it was."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from memprof_otel.sources.read_backoff import ReadBackoff


def backoff_on(clock: SimpleNamespace, **kw: float) -> ReadBackoff:
    settings = {"min_interval_s": 0.5, "max_overhead_ratio": 0.001, **kw}
    return ReadBackoff(clock=lambda: clock.now, **settings)


def costing(clock: SimpleNamespace, seconds: float) -> object:
    """A read that advances the clock by its cost, as a real walk takes that long."""
    clock.now += seconds
    return "figures"


def test_the_wait_is_the_base_until_a_read_is_dear_then_its_cost_over_the_ratio() -> None:
    clock = SimpleNamespace(now=100.0)
    b = backoff_on(clock)
    assert b.min_interval_s == 0.5 and b.reads == 0
    result, start, end = b.timed(lambda: costing(clock, 0.0001))   # 0.1 ms: 0.1 s at 0.1 %
    assert (result, start, end) == ("figures", 100.0, pytest.approx(100.0001))
    assert b.reads == 0                                            # timing records nothing
    b.record(start, end)
    assert b.reads == 1 and b.min_interval_s == 0.5
    _, start, end = b.timed(lambda: costing(clock, 0.005))          # 5 ms: 5 s at 0.1 %
    b.record(start, end)
    assert b.last_cost_s == pytest.approx(0.005)
    # the first read's cost is the average; each later one weighs 0.3
    assert b.cost_ema_s == pytest.approx(0.3 * 0.005 + 0.7 * 0.0001)
    assert b.min_interval_s == pytest.approx(b.cost_ema_s / 0.001)


def test_too_soon_counts_from_the_end_of_the_last_read() -> None:
    clock = SimpleNamespace(now=100.0)
    b = backoff_on(clock, min_interval_s=0.0)
    _, start, end = b.timed(lambda: costing(clock, 0.005))
    b.record(start, end)                                            # wait: 5 s from 100.005
    assert b.age_s() == pytest.approx(0.0)
    clock.now += 4.9
    assert b.too_soon() and b.age_s() == pytest.approx(4.9)
    clock.now += 0.2
    assert not b.too_soon()


def test_hold_off_restarts_the_wait_without_touching_the_cost() -> None:
    clock = SimpleNamespace(now=100.0)
    b = backoff_on(clock, min_interval_s=1.0)
    clock.now += 10
    assert not b.too_soon()
    b.hold_off()                                  # a read is under way: others find it too soon
    assert b.too_soon() and b.reads == 0 and b.cost_ema_s == 0.0


def test_too_dear_compares_the_expected_cost_with_the_bound() -> None:
    clock = SimpleNamespace(now=0.0)
    b = backoff_on(clock)
    b.record(0.0, 0.005)
    assert b.too_dear(0.001) and not b.too_dear(0.01) and not b.too_dear(None)


def test_a_read_that_raises_leaves_no_trace() -> None:
    clock = SimpleNamespace(now=100.0)
    b = backoff_on(clock)

    def boom() -> object:
        clock.now += 1.0
        raise OSError("boom")

    with pytest.raises(OSError):
        b.timed(boom)
    assert (b.reads, b.cost_ema_s, b.last_cost_s) == (0, 0.0, 0.0)


def test_a_clock_that_steps_back_costs_nothing() -> None:
    b = backoff_on(SimpleNamespace(now=0.0))
    b.record(5.0, 4.0)
    assert b.last_cost_s == 0.0 and b.min_interval_s == 0.5


@pytest.mark.parametrize("ratio", [0.0, -0.1, 1.5])
def test_a_ratio_outside_zero_to_one_raises(ratio: float) -> None:
    with pytest.raises(ValueError, match="max_overhead_ratio"):
        backoff_on(SimpleNamespace(now=0.0), max_overhead_ratio=ratio)
