"""The pure heap diff over hand-made tracemalloc snapshots: growth per traceback is the arithmetic
on the traces we wrote, exclusions drop by allocating frame, and the speedscope file validates."""
from __future__ import annotations

import tracemalloc

import pytest

from memprof_otel.dumps.heap_diff import AT_LIMIT_FRAME, diff_snapshots, heap_speedscope
from tests.schemas import validate_speedscope

APP, LIB, OWN = "/srv/app.py", "/venv/lib/lib.py", "/venv/memprof_otel/x.py"
# raw tracemalloc traces: (domain, size, frames most recent first, total frames)
LEAK = ((APP, 42), (APP, 10))            # app.py:10 calls, app.py:42 allocates
CACHE = ((LIB, 7), (APP, 11))
TEMP = ((APP, 50), (APP, 12))


def snap(*traces: tuple[int, tuple[tuple[str, int], ...], int | None], limit: int = 16) -> tracemalloc.Snapshot:
    return tracemalloc.Snapshot([(0, size, frames, total) for size, frames, total in traces], limit)


def test_growth_per_traceback_is_the_difference_of_live_bytes_and_blocks():
    before = snap((100, LEAK, 2), (500, TEMP, 2))
    after = snap((100, LEAK, 2), (1000, LEAK, 2), (24, LEAK, 2), (300, CACHE, 2))  # TEMP freed
    d = diff_snapshots(before, after, top=10)
    assert [s.site for s in d.sites] == [f"{APP}:42", f"{LIB}:7"]
    leak, cache = d.sites
    assert (leak.size_diff, leak.count_diff, leak.size, leak.count) == (1024, 2, 1124, 3)
    assert (cache.size_diff, cache.count_diff) == (300, 1)
    assert leak.traceback == ((APP, 10), (APP, 42))  # oldest first, allocating frame last
    assert d.growth_bytes == 1324 and d.net_bytes == 1324 - 500 and d.sites_grown == 2
    assert (d.traced_bytes_before, d.traced_bytes_after) == (600, 1424)


def test_top_cuts_the_list_but_not_the_totals():
    after = snap(*((n * 10, ((APP, n), (APP, 1)), 2) for n in range(1, 31)))
    d = diff_snapshots(snap(), after, top=3)
    assert [s.line for s in d.sites] == [30, 29, 28]
    assert d.sites_grown == 30 and d.growth_bytes == sum(n * 10 for n in range(1, 31))
    with pytest.raises(ValueError):
        diff_snapshots(snap(), after, top=0)


def test_excluded_and_tracemalloc_allocating_frames_are_left_out():
    mine = ((OWN, 3), (APP, 13))
    through_mine = ((APP, 60), (OWN, 4))   # only the allocating frame decides
    internal = ((tracemalloc.__file__, 560), (APP, 14))
    after = snap((900, mine, 2), (50, through_mine, 2), (800, internal, 2))
    d = diff_snapshots(snap(), after, top=10, exclude=("/venv/memprof_otel/*",))
    assert [s.site for s in d.sites] == [f"{APP}:60"] and d.growth_bytes == 50


def test_speedscope_file_weights_stacks_by_growth_and_marks_cut_tracebacks():
    after = snap((1000, LEAK, 2), (300, CACHE + ((APP, 2),), 9), limit=3)  # the second one hit the limit
    d = diff_snapshots(snap(limit=3), after, top=2)
    assert [s.to_dict()["traceback_at_limit"] for s in d.sites] == [False, True]
    doc = heap_speedscope(d, "growth")
    validate_speedscope(doc)
    (prof,) = doc["profiles"]
    assert prof["unit"] == "bytes" and prof["weights"] == [1000, 300] and prof["endValue"] == 1300
    names = [f["name"] for f in doc["shared"]["frames"]]
    stacks = [[names[i] for i in s] for s in prof["samples"]]
    assert stacks == [[f"{APP}:10", f"{APP}:42"], [AT_LIMIT_FRAME, f"{APP}:2", f"{APP}:11", f"{LIB}:7"]]


def test_no_growth_gives_no_sites_and_a_valid_empty_file():
    same = snap((100, LEAK, 2))
    d = diff_snapshots(same, snap((100, LEAK, 2)), top=5)
    assert d.sites == () and d.growth_bytes == 0 and d.sites_grown == 0
    validate_speedscope(heap_speedscope(d, "nothing"))
