"""The bounded tracemalloc session: tracing is on only while it runs (a process that already traced
keeps its tracing), one session at a time, ``stop()`` ends it early, a store that fails loses no
sites; every outcome counted."""
from __future__ import annotations

import json
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from memprof_otel.dumps.heap_session import HeapProfiler
from memprof_otel.dumps.store import DumpStore
from memprof_otel.errors import CaptureBusy
from tests.schemas import validate_speedscope


@pytest.fixture
def counts() -> list[tuple[str, str]]:
    return []


@pytest.fixture
def profiler(tmp_path: Path, counts: list[tuple[str, str]]) -> HeapProfiler:
    store = DumpStore(tmp_path / "dumps")
    return HeapProfiler(lambda: store, lambda fmt, result: counts.append((fmt, result)))


@pytest.fixture(autouse=True)
def no_tracing_left():
    assert not tracemalloc.is_tracing()
    yield
    if tracemalloc.is_tracing():
        tracemalloc.stop()
        pytest.fail("a test left tracemalloc tracing")


def test_tracing_runs_only_during_the_session_and_the_file_is_stored(profiler, counts, tmp_path):
    seen: list[bool] = []
    t = threading.Timer(0.3, lambda: seen.append(tracemalloc.is_tracing()))
    t.start()
    r = profiler.run(1.0, frames=5, top=3)
    t.join()
    assert seen == [True] and not tracemalloc.is_tracing()
    assert r.frames == 5 and not r.tracing_was_on and not r.stopped_early and 1.0 <= r.elapsed_seconds < 3.0
    assert r.dump is not None and r.dump.kind == "heap" and r.dump_error is None
    validate_speedscope(json.loads(r.dump.path.read_bytes()))
    assert counts == [("heap", "ok")]


def test_a_process_that_traced_keeps_its_tracing_and_its_frame_limit(profiler):
    tracemalloc.start(3)
    try:
        r = profiler.run(1.0, frames=40, top=3)
        assert tracemalloc.is_tracing() and tracemalloc.get_traceback_limit() == 3
        assert r.tracing_was_on and r.frames == 3
    finally:
        tracemalloc.stop()


def test_a_second_session_is_refused_and_stop_ends_the_first_early(profiler, counts):
    results = []
    t = threading.Thread(target=lambda: results.append(profiler.run(30.0)))
    t0 = time.monotonic()
    t.start()
    while not (profiler.running and tracemalloc.is_tracing()):
        assert time.monotonic() - t0 < 10, "the session did not start"
        time.sleep(0.01)
    with pytest.raises(CaptureBusy):
        profiler.run(1.0)
    assert profiler.stop(10.0)
    t.join(10)
    assert time.monotonic() - t0 < 10 and not tracemalloc.is_tracing()
    (r,) = results
    assert r.stopped_early and r.elapsed_seconds < 10
    assert counts == [("heap", "busy"), ("heap", "stopped")]
    assert profiler.stop(0.0)  # nothing runs now


def test_a_store_that_fails_still_answers_the_sites(tmp_path, counts):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    profiler = HeapProfiler(lambda: DumpStore(blocker / "dumps"), lambda f, r: counts.append((f, r)),
                            own=lambda: None)
    r = profiler.run(1.0, top=5)
    assert r.dump is None and "could not be stored" in (r.dump_error or "")
    assert r.diff.sites_grown >= 0 and counts == [("heap", "error")]
    assert not tracemalloc.is_tracing()


@pytest.mark.parametrize("kw", [{"seconds": 0}, {"seconds": -1}, {"seconds": float("nan")}, {"seconds": 1e9},
                                {"seconds": 1, "frames": 0}, {"seconds": 1, "frames": 10**6},
                                {"seconds": 1, "top": 0}])
def test_bad_arguments_raise_before_anything_is_traced(profiler, counts, kw):
    with pytest.raises(ValueError):
        profiler.run(**kw)
    assert not tracemalloc.is_tracing() and counts == [] and not profiler.running
