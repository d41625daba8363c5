"""The OOM cause classifier on constructed figures: each cause follows from plain arithmetic on the
figures given (the room a request had is the limit less what others held less what was held), and
the figures it cites are those."""
from __future__ import annotations

import pytest

from memprof_otel.oom.cause import (CAUSES, EXPANDABLE_SEGMENTS, MOVER_MIN_SHARE, LeakTrend, OomFigures,
                                    classify)

MIB = 1 << 20
GIB = 1 << 30


def test_static_memory_over_what_the_limit_leaves():
    f = OomFigures("cuda:0", limit_bytes=8 * GIB, held_elsewhere_bytes=1 * GIB, static_bytes=7 * GIB,
                   predicted_peak_bytes=10 * MIB)
    c = classify(f)
    assert f.room_bytes == 8 * GIB - 1 * GIB - 7 * GIB == 0
    assert c.cause == "static_over_limit"
    assert c.to_dict()["figures"]["room_bytes"] == 0


def test_a_request_whose_predicted_peak_is_over_the_room_and_the_batch_to_lower_to():
    limit, static, predicted = 4 * GIB, 1 * GIB, 3 * GIB + 1
    f = OomFigures("cuda:0", limit_bytes=limit, static_bytes=static, predicted_peak_bytes=predicted,
                   features={"batch": 32, "seq_len": 512}, max_safe_batch=21)
    c = classify(f)
    assert predicted > limit - static
    assert c.cause == "request_too_big"
    assert c.knob.startswith("lower the batch to 21") and "seq_len 512" in c.knob
    d = c.to_dict()
    assert d["figures"]["room_bytes"] == limit - static and d["figures"]["max_safe_batch"] == 21
    assert d["missing"] == []


def test_a_request_that_fits_its_room_is_not_too_big():
    f = OomFigures("cuda:0", limit_bytes=4 * GIB, static_bytes=1 * GIB, predicted_peak_bytes=3 * GIB)
    assert classify(f).cause != "request_too_big"  # exactly the room: it fits


def test_no_batch_fits_says_so_instead_of_lowering_to_zero():
    f = OomFigures("cpu", limit_bytes=GIB, static_bytes=900 * MIB, predicted_peak_bytes=200 * MIB,
                   features={"batch": 4, "seq_len": 128}, max_safe_batch=0)
    c = classify(f)
    assert c.cause == "request_too_big" and "no batch fits at seq_len 128" in c.knob


def test_fragmentation_when_the_free_memory_was_enough_but_no_block():
    # 600 MiB reserved and free in split blocks + 100 MiB the limit leaves beyond the reserve: a
    # 512 MiB segment would have fitted in the sum, yet the allocation failed
    f = OomFigures("cuda:0", limit_bytes=8 * GIB, static_bytes=6 * GIB, predicted_peak_bytes=1 * GIB,
                   requested_bytes=512 * MIB, reserved_free_bytes=600 * MIB, room_beyond_reserved_bytes=100 * MIB)
    c = classify(f)
    assert f.free_bytes == 700 * MIB >= 512 * MIB
    assert c.cause == "fragmentation" and EXPANDABLE_SEGMENTS in c.knob
    assert c.to_dict()["figures"]["free_bytes"] == 700 * MIB


def test_not_fragmentation_when_the_free_memory_was_short_or_a_block_was_large_enough():
    base = dict(limit_bytes=8 * GIB, static_bytes=6 * GIB, requested_bytes=512 * MIB)
    short = OomFigures("cuda:0", reserved_free_bytes=300 * MIB, room_beyond_reserved_bytes=100 * MIB, **base)
    assert short.free_bytes == 400 * MIB < 512 * MIB and classify(short).cause != "fragmentation"
    big_block = OomFigures("cuda:0", reserved_free_bytes=600 * MIB, largest_free_block_bytes=512 * MIB, **base)
    assert classify(big_block).cause != "fragmentation"
    # a room beyond the reserve below 0 (others grew into it) adds nothing
    over = OomFigures("cuda:0", reserved_free_bytes=500 * MIB, room_beyond_reserved_bytes=-100 * MIB, **base)
    assert over.free_bytes == 500 * MIB and classify(over).cause != "fragmentation"
    # nothing free in the reserve: a request that fits what the limit leaves is no fragmentation
    none = OomFigures("cuda:0", reserved_free_bytes=0, room_beyond_reserved_bytes=600 * MIB, **base)
    assert classify(none).cause != "fragmentation"


def test_the_request_too_big_by_prediction_wins_over_fragmentation():
    f = OomFigures("cuda:0", limit_bytes=8 * GIB, static_bytes=6 * GIB, predicted_peak_bytes=3 * GIB,
                   requested_bytes=512 * MIB, reserved_free_bytes=600 * MIB)
    assert classify(f).cause == "request_too_big"


def test_memory_outside_the_allocator_that_took_the_room():
    limit, static = 2 * GIB, 1 * GIB
    room = limit - static
    f = OomFigures("cpu", limit_bytes=limit, static_bytes=static, predicted_peak_bytes=100 * MIB,
                   request_rise_bytes=50 * MIB, outside_baseline_bytes=200 * MIB, outside_bytes=200 * MIB + 800 * MIB)
    c = classify(f)
    assert f.outside_growth_bytes == 800 * MIB >= MOVER_MIN_SHARE * room
    assert c.cause == "outside_allocator"
    assert str(800 * MIB) in c.knob  # the margin that leaves it room


def test_the_requests_measured_rise_that_took_the_room():
    limit, static = 700 * MIB, 200 * MIB
    f = OomFigures("cpu", limit_bytes=limit, static_bytes=static, predicted_peak_bytes=2 * MIB,
                   features={"batch": 3, "seq_len": 37}, max_safe_batch=400,
                   request_rise_bytes=480 * MIB, outside_baseline_bytes=100 * MIB, outside_bytes=110 * MIB)
    c = classify(f)
    assert c.cause == "request_too_big"
    # the batch was within the safe batch: the knob says the memory depends on the data
    assert "depends on its data" in c.knob and "400" in c.knob


def test_a_leak_that_took_the_room():
    leak = LeakTrend("layer", "m", "blocks.3.cache", "cuda:0", 2 * MIB, 900 * MIB, 450.0)
    f = OomFigures("cuda:0", limit_bytes=4 * GIB, static_bytes=3 * GIB, predicted_peak_bytes=200 * MIB, leak=leak,
                   outside_baseline_bytes=300 * MIB, outside_bytes=310 * MIB)
    c = classify(f)
    assert c.cause == "leak" and "blocks.3.cache" in c.summary and "blocks.3.cache" in c.knob
    assert c.to_dict()["figures"]["leak"]["growth_bytes"] == 900 * MIB


def test_the_largest_mover_wins_and_small_moves_explain_nothing():
    room = 1 * GIB
    leak = LeakTrend("process", "", "", "", 1e5, 700 * MIB, 600.0)
    f = OomFigures("cpu", limit_bytes=2 * GIB, static_bytes=1 * GIB, request_rise_bytes=600 * MIB,
                   outside_baseline_bytes=0, outside_bytes=650 * MIB, leak=leak)
    assert classify(f).cause == "leak"  # 700 > 650 > 600, all over half the room
    small = OomFigures("cpu", limit_bytes=2 * GIB, static_bytes=1 * GIB, request_rise_bytes=300 * MIB,
                       outside_baseline_bytes=0, outside_bytes=400 * MIB)
    assert max(300, 400) * MIB < MOVER_MIN_SHARE * room
    c = classify(small)
    assert c.cause == "unknown" and "half the room" in c.summary


def test_unknown_names_the_missing_figures():
    c = classify(OomFigures("cuda:0"))
    assert c.cause == "unknown"
    assert set(c.missing) >= {"limit_bytes", "static_bytes", "predicted_peak_bytes", "requested_bytes"}
    assert c.to_dict()["figures"] == {"device": "cuda:0", "held_elsewhere_bytes": 0}
    for cause in CAUSES:
        assert cause.islower()


@pytest.mark.parametrize("bad", [{"limit_bytes": -1}, {"static_bytes": 1.5}, {"max_safe_batch": -2},
                                 {"requested_bytes": True}])
def test_bad_figures_are_a_clear_error(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        OomFigures("cpu", **bad)
