"""HostAllocatorSource: the pure mallinfo2 arithmetic, the real glibc here, back-off, detection."""
from __future__ import annotations

import gc
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest

from memprof_otel.errors import SourceUnavailable
from memprof_otel.sources.base import MemorySource, Reading
from memprof_otel.sources.glibc import (
    MALLINFO2_FIELDS, HostAllocatorSource, backend, figures_from_mallinfo,
)

MiB = 1 << 20
NO_FOREIGN: dict[str, str] = {}  # an environ without LD_PRELOAD, so the test's own env can't leak


def mallinfo(**fields: int) -> dict[str, int]:
    out = dict.fromkeys(MALLINFO2_FIELDS, 0)
    out.update(fields)
    return out


HEAP = mallinfo(arena=1_000_000, hblkhd=500_000, uordblks=700_000, fordblks=300_000,
                keepcost=100_000)


def fake_source(fn: Callable[[], dict[str, int]], tmp_path: Path,
                **kw: Any) -> HostAllocatorSource:
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    return HostAllocatorSource(mallinfo2=fn, maps_path=str(maps), environ=NO_FOREIGN, **kw)


_PROBE = HostAllocatorSource.probe()
real_glibc = pytest.mark.skipif(not _PROBE.available, reason=f"no mallinfo2: {_PROBE.reason}")


# -- pure arithmetic ---------------------------------------------------------------------------
def test_figures_from_mallinfo_known_numbers() -> None:
    f = figures_from_mallinfo(HEAP)
    assert f["allocated_bytes"] == 1_200_000          # uordblks + hblkhd
    assert f["reserved_bytes"] == 1_500_000           # arena + hblkhd
    assert f["active_bytes"] == 1_200_000
    assert f["inactive_split_bytes"] == 200_000       # fordblks - keepcost
    assert f["fragmentation_ratio"] == pytest.approx(200_000 / 1_500_000)
    assert f["cache_free_ratio"] == pytest.approx(300_000 / 1_500_000)
    assert f["allocated_peak_bytes"] == 1_200_000 and f["reserved_peak_bytes"] == 1_500_000
    assert f["alloc_retries"] == 0 and f["ooms"] == 0
    spec_cache_free = (f["reserved_bytes"] - f["allocated_bytes"]) / f["reserved_bytes"]
    assert f["cache_free_ratio"] == pytest.approx(spec_cache_free)


def test_figures_peaks_are_max_of_now_and_given() -> None:
    f = figures_from_mallinfo(HEAP, allocated_peak=5_000_000, reserved_peak=10)
    assert f["allocated_peak_bytes"] == 5_000_000
    assert f["reserved_peak_bytes"] == 1_500_000


def test_only_the_trimmable_top_chunk_free_is_not_fragmentation() -> None:
    f = figures_from_mallinfo(mallinfo(arena=1000, uordblks=600, fordblks=400, keepcost=400))
    assert f["fragmentation_ratio"] == 0.0 and f["inactive_split_bytes"] == 0
    assert f["cache_free_ratio"] == pytest.approx(0.4)


def test_empty_heap_has_zero_ratios() -> None:
    f = figures_from_mallinfo(mallinfo())
    assert f["fragmentation_ratio"] == 0.0 and f["cache_free_ratio"] == 0.0


# -- the real glibc ----------------------------------------------------------------------------
@real_glibc
def test_real_source_is_a_memory_source_named_cpu() -> None:
    src = HostAllocatorSource()
    assert isinstance(src, MemorySource) and src.name == "cpu"
    assert backend() == "glibc"
    assert src.reads == 1 and src.last_read_cost_s > 0
    assert src.reading().reserved >= src.reading().allocated > 0


def _wait_out_back_off(src: HostAllocatorSource) -> None:
    """Sleep past the source's interval between real reads. With ratio 1 that interval is still the
    read's own cost: in a worker whose heap many tests grew, mallinfo2 walks its free chunks for
    milliseconds, so a fixed 2 ms wait let the next refresh() be skipped."""
    time.sleep(0.002 + src.min_interval_s)


@real_glibc
def test_real_mallinfo2_sees_a_50mib_allocation_and_its_free() -> None:
    # Back-off relaxed so that refresh() really reads once the (tiny) interval has passed.
    src = HostAllocatorSource(min_interval_s=0.0, max_overhead_ratio=1.0)
    _wait_out_back_off(src)
    before = src.refresh()["allocated_bytes"]
    buf = bytearray(50 * MiB)
    _wait_out_back_off(src)
    reads = src.reads
    held = src.refresh()["allocated_bytes"]
    assert src.reads == reads + 1
    # mallinfo2 counts the whole process: another thread of the worker (a sampler a previous test
    # left winding down) may free a little between the two reads (1.3 KiB once, on a loaded machine)
    assert held - before >= 49 * MiB
    assert src.reading().allocated == held
    del buf
    gc.collect()
    _wait_out_back_off(src)
    after = src.refresh()["allocated_bytes"]
    assert after <= held - 45 * MiB
    assert src.stats()["allocated_peak_bytes"] >= held


# -- back-off ----------------------------------------------------------------------------------
def test_slow_mallinfo2_makes_refreshes_within_the_interval_skip(tmp_path: Path) -> None:
    calls = []

    def slow() -> dict[str, int]:
        calls.append(1)
        time.sleep(0.005)
        return HEAP

    src = fake_source(slow, tmp_path)
    assert src.last_read_cost_s >= 0.005
    assert src.min_interval_s >= 5.0                   # 1000x the cost: <= 0.1 % of wall time
    for _ in range(10):
        assert src.refresh()["allocated_bytes"] == 1_200_000
    assert len(calls) == 1 and src.reads == 1 and src.skipped == 10
    src.read(force=True)
    assert len(calls) == 2 and src.reads == 2


def test_back_off_reads_again_once_the_interval_has_passed(tmp_path: Path) -> None:
    clock = SimpleNamespace(now=100.0)  # fakes advance it by their 'cost': deterministic

    def costs_5ms() -> dict[str, int]:
        clock.now += 0.005
        return HEAP

    src = fake_source(costs_5ms, tmp_path, clock=lambda: clock.now)
    assert src.cost_ema_s == pytest.approx(0.005)
    assert src.min_interval_s == pytest.approx(5.0)
    clock.now += 4.9
    src.maybe_read()
    assert (src.reads, src.skipped) == (1, 1)
    clock.now += 0.2
    src.maybe_read()
    assert (src.reads, src.skipped) == (2, 1)


def test_base_interval_holds_when_reads_are_cheap(tmp_path: Path) -> None:
    clock = SimpleNamespace(now=100.0)
    src = fake_source(lambda: HEAP, tmp_path, clock=lambda: clock.now, min_interval_s=0.5)
    assert src.min_interval_s == 0.5
    clock.now += 0.4
    src.refresh()
    clock.now += 0.2
    src.refresh()
    assert (src.reads, src.skipped) == (2, 1)


def test_max_cost_skips_reads_expected_to_cost_more(tmp_path: Path) -> None:
    clock = SimpleNamespace(now=100.0)

    def costs_5ms() -> dict[str, int]:
        clock.now += 0.005
        return HEAP

    src = fake_source(costs_5ms, tmp_path, clock=lambda: clock.now)
    clock.now += 60
    src.read(max_cost_s=0.001)
    assert (src.reads, src.skipped) == (1, 1)
    src.read(max_cost_s=0.01)
    assert (src.reads, src.skipped) == (2, 1)


def test_reading_and_accessors_never_call_mallinfo2(tmp_path: Path) -> None:
    calls = []

    def counting() -> dict[str, int]:
        calls.append(1)
        return HEAP

    src = fake_source(counting, tmp_path)
    assert len(calls) == 1                             # construction reads once
    for _ in range(1000):
        r = src.reading()
    assert (src.allocated(), src.reserved(), src.peak_since_reset()) == (1_200_000, 1_500_000,
                                                                         1_200_000)
    src.reset_peak()
    assert len(calls) == 1
    assert r == Reading(1_200_000, 1_500_000, 1_200_000, 0, 0, 200_000 / 1_500_000, 1_500_000)


def test_reset_peak_restarts_since_reset_peak_but_not_the_lifetime_peak(tmp_path: Path) -> None:
    levels = iter([100, 300, 200, 250])

    def scripted() -> dict[str, int]:
        used = next(levels)
        return mallinfo(arena=1000, uordblks=used, fordblks=1000 - used)

    src = fake_source(scripted, tmp_path)
    src.read(force=True)
    src.read(force=True)                               # 100 -> 300 -> 200
    assert src.peak_since_reset() == 300
    src.reset_peak()
    assert src.peak_since_reset() == 200 and src.reading().peak == 200
    src.read(force=True)                               # 250
    assert src.peak_since_reset() == 250
    assert src.stats()["allocated_peak_bytes"] == 300  # lifetime, like the CUDA source


@pytest.mark.parametrize("bad", [{"min_interval_s": -1}, {"max_overhead_ratio": 0}])
def test_bad_back_off_settings_raise(tmp_path: Path, bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        fake_source(lambda: HEAP, tmp_path, **bad)


# -- detection ---------------------------------------------------------------------------------
JEMALLOC_MAPS = (
    "55d0-55d1 r-xp 00000000 08:01 7 /usr/bin/python3.11\n"
    "7f10-7f20 r-xp 00000000 08:01 8 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n"
    "7f30-7f40 r-xp 00000000 08:01 9 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
    "7ffd-7ffe rw-p 00000000 00:00 0 [stack]\n"
)


def test_jemalloc_in_maps_makes_the_source_unavailable(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(JEMALLOC_MAPS)
    probe = HostAllocatorSource.probe(mallinfo2=lambda: HEAP, maps_path=str(maps),
                                      environ=NO_FOREIGN)
    assert not probe.available and probe.backend == "jemalloc"
    assert "libjemalloc.so.2" in probe.reason
    assert backend(mallinfo2=lambda: HEAP, maps_path=str(maps), environ=NO_FOREIGN) == "jemalloc"
    with pytest.raises(SourceUnavailable, match="jemalloc"):
        HostAllocatorSource(mallinfo2=lambda: HEAP, maps_path=str(maps), environ=NO_FOREIGN)


def test_tcmalloc_in_ld_preload_makes_the_source_unavailable(tmp_path: Path) -> None:
    env = {"LD_PRELOAD": "/usr/lib/libtcmalloc_minimal.so.4"}
    probe = HostAllocatorSource.probe(mallinfo2=lambda: HEAP, maps_path=str(tmp_path / "none"),
                                      environ=env)
    assert (probe.available, probe.backend) == (False, "tcmalloc")
    assert "LD_PRELOAD" in probe.reason


def test_libc_without_mallinfo2_is_unavailable_with_a_reason(tmp_path: Path) -> None:
    probe = HostAllocatorSource.probe(libc=SimpleNamespace(), maps_path=str(tmp_path / "none"),
                                      environ=NO_FOREIGN)
    assert not probe.available and "mallinfo2" in probe.reason
    with pytest.raises(SourceUnavailable, match="mallinfo2"):
        HostAllocatorSource(libc=SimpleNamespace(), maps_path=str(tmp_path / "x"),
                            environ=NO_FOREIGN)


def test_a_libc_object_with_mallinfo2_is_used(tmp_path: Path) -> None:
    libc = SimpleNamespace(mallinfo2=lambda: SimpleNamespace(**HEAP))  # attribute-style result
    src = HostAllocatorSource(libc=libc, maps_path=str(tmp_path / "none"), environ=NO_FOREIGN)
    assert src.allocated() == 1_200_000 and src.reserved() == 1_500_000


def test_a_slow_read_in_flight_blocks_neither_hooks_nor_other_readers(tmp_path: Path) -> None:
    release, entered = threading.Event(), threading.Event()
    calls = []

    def blocking() -> dict[str, int]:
        calls.append(1)
        if len(calls) > 1:                             # construction's read returns at once
            entered.set()
            release.wait(10)
        return HEAP

    src = fake_source(blocking, tmp_path)
    reader = threading.Thread(target=lambda: src.read(force=True))
    reader.start()
    try:
        assert entered.wait(10)
        started = time.perf_counter()
        src.reset_peak()
        src.reading()
        assert src.read(force=True)["allocated_bytes"] == 1_200_000   # cached, not a 2nd walk
        assert time.perf_counter() - started < 1.0
        assert len(calls) == 2 and src.skipped == 1
    finally:
        release.set()
        reader.join(10)
    assert src.reads == 2


def test_a_failing_read_does_not_wedge_the_source(tmp_path: Path) -> None:
    fail = [False]

    def flaky() -> dict[str, int]:
        if fail[0]:
            raise OSError("boom")
        return HEAP

    src = fake_source(flaky, tmp_path)
    fail[0] = True
    with pytest.raises(OSError):
        src.read(force=True)
    fail[0] = False
    src.read(force=True)
    assert src.reads == 2 and src.reading().allocated == 1_200_000


def test_fresh_reading_reads_when_allowed_and_refuses_a_reading_older_than_asked(tmp_path: Path) -> None:
    clock = SimpleNamespace(now=100.0)
    heap = {"now": HEAP}

    def costs_5ms() -> dict[str, int]:
        clock.now += 0.005
        return heap["now"]

    src = fake_source(costs_5ms, tmp_path, clock=lambda: clock.now)  # back-off: 5 s
    heap["now"] = mallinfo(arena=2_000_000, uordblks=1_700_000, fordblks=300_000)
    clock.now += 1.0
    # GIVEN a cached reading 1 s old that the back-off will not replace yet
    assert src.fresh_reading(0.1) is None and src.reads == 1
    assert src.fresh_reading(2.0).allocated == 1_200_000  # old enough is the caller's call
    # WHEN the back-off allows a read THEN the figures are the new ones
    clock.now += 5.0
    r = src.fresh_reading(0.1)
    assert r is not None and r.allocated == 1_700_000 and src.reads == 2
