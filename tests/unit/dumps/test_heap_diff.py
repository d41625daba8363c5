"""The pure heap diff over hand-made tracemalloc snapshots: growth per traceback is the arithmetic
on the traces we wrote, exclusions drop by allocating frame, and the speedscope file validates."""
from __future__ import annotations

import tracemalloc

import pytest

from memprof_otel.dumps.heap_diff import AT_LIMIT_FRAME, OwnCode, diff_snapshots, heap_speedscope
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


OWN_CODE = OwnCode(package=("/venv/memprof_otel/",), libraries=("/usr/lib/python3/", "/venv/lib/"),
                   callouts=frozenset({(OWN, 200)}))
STDLIB = "/usr/lib/python3/threading.py"


def test_tracemalloc_and_memprof_allocations_are_left_out_application_ones_kept():
    # traces as tracemalloc records them (most recent first); each name says whose it is
    cases = {
        "ours, allocating": (((OWN, 3), (APP, 13)), True),
        "our thread waiting on an Event": (((STDLIB, 300), (STDLIB, 600), (OWN, 40), (STDLIB, 1000)), True),
        "our hook through a library": (((LIB, 5), (OWN, 41), (LIB, 900), (APP, 15)), True),
        "the application through our frames": (((APP, 60), (OWN, 4)), False),
        "a library called by the application": (((LIB, 6), (APP, 16), (OWN, 41)), False),
        "a library called by our callout": (((LIB, 7), (STDLIB, 8), (OWN, 200), (APP, 17)), False),
        "our callout line allocating itself": (((OWN, 200), (APP, 18)), True),
        "library frames only, cut by the limit": (((LIB, 9), (STDLIB, 10)), False),
        "a dataclass __init__ made by ours": ((("<string>", 2), (OWN, 42), (APP, 19)), True),
    }
    traces = [(100 * (i + 1), frames, 9) for i, (frames, _) in enumerate(cases.values())]
    traces.append((800, ((tracemalloc.__file__, 560), (APP, 14)), 2))  # tracemalloc's own lists
    d = diff_snapshots(snap(), snap(*traces), top=20, own=OWN_CODE)
    kept = {s.traceback[::-1] for s in d.sites}
    for name, (frames, ours) in cases.items():
        assert (frames not in kept) == ours, name
        assert OWN_CODE.owns(frames[::-1]) == ours, name  # owns() takes oldest first
    assert d.growth_bytes == sum(size for (size, frames, _), (_, ours) in zip(traces, cases.values()) if not ours)
    # without own, only tracemalloc's allocations go
    assert diff_snapshots(snap(), snap(*traces), top=20).sites_grown == len(cases)


def test_an_installed_memprof_inside_site_packages_is_still_ours():
    inside = OwnCode(package=("/venv/lib/site-packages/memprof_otel/",), libraries=("/usr/lib/python3/", "/venv/lib/"))
    assert inside.owns([("/venv/lib/site-packages/memprof_otel/telemetry/sampler.py", 9), (STDLIB, 1)])
    assert not inside.owns([("/venv/lib/site-packages/myapp/serve.py", 9), (STDLIB, 1)])


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
