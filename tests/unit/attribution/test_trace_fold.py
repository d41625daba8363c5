"""boundary_readings: allocator trace events -> the readings a per-boundary stats read would give,
checked against a reference that replays the same script with a live counter and a peak register."""
from __future__ import annotations

import random

from memprof_otel.attribution.peaks import PeakTracker
from memprof_otel.attribution.trace_fold import boundary_readings
from memprof_otel.sources.base import Reading


def ev(action: str, size: int, md: str) -> dict:
    return {"action": action, "size": size, "user_metadata": md, "addr": 0, "stream": 0}


def test_windows_levels_and_peaks_per_boundary() -> None:
    tag = "m1:"
    events = [
        ev("alloc", 100, "m1:0"), ev("free_requested", 100, "m1:0"), ev("free_completed", 100, "m1:0"),
        ev("alloc", 50, "m1:0"),
        ev("alloc", 7, "m2:0"),  # another forward's: not ours
        ev("alloc", 10, "m1:2"), ev("free_requested", 50, "m1:2"),
        ev("segment_alloc", 2048, "m1:2"),
        ev("alloc", 999, "m1:4"),  # after the last boundary: the teardown, ignored
    ]
    r = boundary_readings(events, tag, 4, base_allocated=1000, base_reserved=4096)
    assert [x.allocated for x in r] == [1000, 1050, 1050, 1010]
    assert [x.peak for x in r] == [1000, 1100, 1050, 1060]   # window 0 reached 100 before its free
    assert [x.reserved for x in r] == [4096, 4096, 4096, 4096 + 2048]
    assert r[3].reserved_peak == 4096 + 2048
    assert [x.allocations for x in r] == [0, 2, 2, 3] and [x.frees for x in r] == [0, 1, 1, 2]
    assert all(x.fragmentation is None for x in r)  # not known from events: absent, never made up


def test_no_boundaries_no_readings_and_tag_prefixes_do_not_collide() -> None:
    assert boundary_readings([ev("alloc", 1, "m1:0")], "m1:", 0, 0, 0) == []
    # "m1:" must not take "m11:"'s events (tags end in ':')
    r = boundary_readings([ev("alloc", 5, "m11:0")], "m1:", 2, 0, 0)
    assert [x.allocated for x in r] == [0, 0]


def _reference(script: list[tuple[int, int]], boundaries: int) -> list[Reading]:
    """A live counter with a peak register reset at every boundary: ``script`` holds (window,
    signed size) steps in order."""
    level, peak, out, w = 0, 0, [], 0
    out.append(Reading(0, 0, 0, 0, 0, None, 0))
    for window, size in script:
        while w < window:
            w += 1
            out.append(Reading(level, 0, peak, 0, 0, None, 0))
            peak = level
        level += size
        peak = max(peak, level)
    while len(out) < boundaries:
        out.append(Reading(level, 0, peak, 0, 0, None, 0))
        peak = level
    return out


def test_random_scripts_match_a_live_counter_and_feed_the_tracker_alike() -> None:
    rnd = random.Random(7)
    for _ in range(200):
        boundaries = rnd.randint(2, 12)
        live: list[int] = []
        script: list[tuple[int, int]] = []
        events = []
        for window in sorted(rnd.randrange(boundaries) for _ in range(rnd.randint(0, 30))):
            if live and rnd.random() < 0.45:
                size = live.pop(rnd.randrange(len(live)))
                script.append((window, -size))
                events.append(ev("free_requested", size, f"t9:{window}"))
            else:
                size = rnd.randint(1, 64) * 512
                live.append(size)
                script.append((window, size))
                events.append(ev("alloc", size, f"t9:{window}"))
            if rnd.random() < 0.3:
                events.append(ev("alloc", 4096, f"t8:{window}"))  # another thread's noise
        got = boundary_readings(events, "t9:", boundaries, 0, 0)
        want = _reference(script, boundaries)
        assert [(g.allocated, g.peak) for g in got] == [(w.allocated, w.peak) for w in want]
        # and the tracker, fed either, closes the same frames with the same figures
        calls = []
        for readings in (got, want):
            t = PeakTracker()
            t.enter("", 0, readings[0], 0.0)
            for i in range(1, boundaries - 1):
                (t.enter(f"l{i}", i, readings[i], 0.0) if i % 2 else t.exit(i - 1, readings[i], 0.0))
            calls.append([(c.path, c.peak_increase, c.retained) for c in t.exit(0, readings[-1], 0.0)])
        assert calls[0] == calls[1]
