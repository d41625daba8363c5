"""CUDA allocator source: pure figures, and the source driven by the scripted allocator double."""
from __future__ import annotations

import math
import threading
from typing import Any

import pytest
import torch

from memprof_otel.errors import SourceUnavailable
from memprof_otel.sources.base import MemorySource, Reading
from memprof_otel.sources.cuda import CudaAllocatorSource, available_devices
from memprof_otel.sources.cuda_stats import FIGURE_KEYS, figures, reading
from tests.doubles.cuda_allocator_double import KIB, MIB, ScriptedCudaAllocatorDouble

# The top-level keys torch/csrc/cuda/Module.cpp (memoryStats) emits; the double must match them.
REAL_STAT_ARRAYS = {"allocation", "segment", "active", "inactive_split", "allocated_bytes",
                    "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes"}
REAL_SCALARS = {"num_alloc_retries", "num_ooms", "max_split_size", "num_sync_all_streams",
                "num_device_alloc", "num_device_free"}


def _stat(current: int = 0, peak: int = 0, allocated: int = 0, freed: int = 0) -> dict[str, int]:
    return {"current": current, "peak": peak, "allocated": allocated, "freed": freed}


def _pools(**all_pool: int) -> dict[str, dict[str, int]]:
    return {"all": _stat(**all_pool), "small_pool": _stat(), "large_pool": _stat()}


def _source(double: ScriptedCudaAllocatorDouble) -> CudaAllocatorSource:
    return CudaAllocatorSource(double.device_index, stats_fn=double.memory_stats_nested,
                               reset_peak_fn=double.reset_peak)


# -- figures() on hand-written dicts ------------------------------------------------------------

def test_figures_reads_the_aggregate_pool_of_a_full_nested_dict() -> None:
    nested: dict[str, Any] = {
        "allocated_bytes": _pools(current=300, peak=900, allocated=5000, freed=4700),
        "reserved_bytes": _pools(current=1000, peak=1200),
        "active_bytes": _pools(current=350),
        "inactive_split_bytes": _pools(current=250),
        "requested_bytes": _pools(current=280),
        "allocation": _pools(current=3, peak=9, allocated=40, freed=37),
        "segment": _pools(current=1), "active": _pools(current=4), "inactive_split": _pools(current=2),
        "num_alloc_retries": 2, "num_ooms": 1, "max_split_size": -1,
        "oversize_allocations": _stat(), "oversize_segments": _stat(),
    }
    f = figures(nested)
    assert set(f) == set(FIGURE_KEYS)
    assert (f["allocated_bytes"], f["reserved_bytes"], f["active_bytes"]) == (300, 1000, 350)
    assert f["inactive_split_bytes"] == 250
    assert (f["allocated_peak_bytes"], f["reserved_peak_bytes"]) == (900, 1200)
    assert (f["alloc_retries"], f["ooms"]) == (2, 1)
    assert (f["allocations"], f["frees"]) == (40, 37)
    assert f["fragmentation_ratio"] == pytest.approx(0.25)
    assert f["cache_free_ratio"] == pytest.approx(0.7)


def test_figures_of_partial_and_empty_dicts_are_zero_not_errors() -> None:
    partial = {"allocated_bytes": {"all": {"current": 4096}}, "reserved_bytes": {"large_pool": {}}}
    f = figures(partial)
    assert f["allocated_bytes"] == 4096
    assert all(f[k] == 0 for k in FIGURE_KEYS if k != "allocated_bytes")
    assert figures({}) == {k: 0 for k in FIGURE_KEYS}
    assert reading({}) == Reading(0, 0, 0, 0, 0, 0.0)


@pytest.mark.parametrize("nested", [
    {"allocated_bytes": {"all": {"current": "4096"}}},
    {"allocated_bytes": {"all": {"current": None}}},
    {"allocated_bytes": {"all": {"current": True}}},
    {"allocated_bytes": {"all": {"current": math.nan}}},
    {"allocated_bytes": {"all": {"current": -1}}},
    {"allocated_bytes": {"all": 17}},
    {"allocated_bytes": [1, 2]},
    {"num_ooms": [1]},
    ["not", "a", "dict"],
])
def test_figures_rejects_garbage_with_value_error(nested: Any) -> None:
    with pytest.raises(ValueError):
        figures(nested)


def test_ratios_are_zero_for_an_empty_allocator_and_clamped() -> None:
    assert figures({"reserved_bytes": _pools(current=0)})["cache_free_ratio"] == 0.0
    # allocated > reserved cannot happen in a sane allocator; the ratio must still stay in 0..1.
    odd = {"allocated_bytes": _pools(current=10), "reserved_bytes": _pools(current=5)}
    assert figures(odd)["cache_free_ratio"] == 0.0


# -- the double matches the real layout ----------------------------------------------------------

def test_double_emits_the_real_nested_layout() -> None:
    nested = ScriptedCudaAllocatorDouble().memory_stats_nested(0)
    assert REAL_STAT_ARRAYS | REAL_SCALARS <= set(nested)
    for name in REAL_STAT_ARRAYS:
        assert set(nested[name]) == {"all", "small_pool", "large_pool"}
        assert set(nested[name]["all"]) == {"current", "peak", "allocated", "freed"}
    assert set(nested["oversize_allocations"]) == {"current", "peak", "allocated", "freed"}


# -- the source over the double -------------------------------------------------------------------

def test_source_implements_memory_source_and_is_named_by_device() -> None:
    src = _source(ScriptedCudaAllocatorDouble(device_index=3))
    assert isinstance(src, MemorySource)
    assert src.name == "cuda:3"


def test_small_request_is_rounded_to_512_and_reserves_a_2mib_segment() -> None:
    double = ScriptedCudaAllocatorDouble()
    src = _source(double)
    double.malloc(1000)
    assert src.allocated() == 1024          # two 512 B units
    assert src.reserved() == 2 * MIB
    assert double.memory_stats_nested(0)["requested_bytes"]["all"]["current"] == 1000


def test_allocated_reserved_and_peak_follow_a_scripted_pattern() -> None:
    double = ScriptedCudaAllocatorDouble()
    src = _source(double)
    a = double.malloc(4 * MIB)              # 1..10 MiB: carved from a new 20 MiB segment
    b = double.malloc(12 * MIB)             # fits the 16 MiB rest of that segment
    assert (src.allocated(), src.reserved()) == (16 * MIB, 20 * MIB)
    c = double.malloc(14 * MIB)             # >= 10 MiB and no fit left: its own 14 MiB segment
    assert (src.allocated(), src.reserved()) == (30 * MIB, 34 * MIB)
    double.free(c)
    double.free(b)
    r = src.reading()
    assert (r.allocated, r.reserved, r.peak) == (4 * MIB, 34 * MIB, 30 * MIB)
    double.free(a)
    double.empty_cache()
    r = src.reading()
    assert (r.allocated, r.reserved, r.peak) == (0, 0, 30 * MIB)
    assert (r.allocations, r.frees) == (3, 3)


def test_fragmentation_counts_only_stranded_gaps_while_cache_free_counts_all_cache() -> None:
    # GIVEN three 100 KiB blocks in one 2 MiB small segment, and a cached but whole 12 MiB segment
    double = ScriptedCudaAllocatorDouble()
    src = _source(double)
    a, b, c = (double.malloc(100 * KIB) for _ in range(3))
    double.free(double.malloc(12 * MIB))
    # WHEN the middle block is freed
    double.free(b)
    # THEN b and the segment's tail are inactive split; the free 12 MiB segment is not
    stats = src.stats()
    reserved = 14 * MIB
    stranded = 2 * MIB - 200 * KIB
    assert stats["inactive_split_bytes"] == stranded
    assert stats["fragmentation_ratio"] == pytest.approx(stranded / reserved)
    assert stats["cache_free_ratio"] == pytest.approx((reserved - 200 * KIB) / reserved)
    assert src.reading().fragmentation == pytest.approx(stranded / reserved)
    # WHEN c is freed too, b, c and the tail merge into one gap
    double.free(c)
    assert double.memory_stats_nested(0)["inactive_split"]["all"]["current"] == 1
    assert src.stats()["inactive_split_bytes"] == 2 * MIB - 100 * KIB
    # WHEN everything is freed and the cache emptied, nothing is fragmented
    double.free(a)
    assert src.stats()["inactive_split_bytes"] == 0
    double.empty_cache()
    assert src.stats()["fragmentation_ratio"] == 0.0 and src.reserved() == 0


def test_freed_block_is_reused_best_fit_without_new_segment() -> None:
    double = ScriptedCudaAllocatorDouble()
    src = _source(double)
    double.malloc(100 * KIB)
    double.free(double.malloc(300 * KIB))
    double.malloc(200 * KIB)
    assert src.reserved() == 2 * MIB
    assert double.memory_stats_nested(0)["num_device_alloc"] == 1


def test_lifetime_peak_survives_reset_peak() -> None:
    double = ScriptedCudaAllocatorDouble()
    src = _source(double)
    keep = double.malloc(2 * MIB)
    double.free(double.malloc(64 * MIB))
    assert src.peak_since_reset() == 66 * MIB
    src.reset_peak()
    assert double.reset_peak_calls == 1
    assert src.peak_since_reset() == 2 * MIB     # the device peak is now "since reset"
    stats = src.stats()
    assert stats["allocated_peak_bytes"] == 66 * MIB
    assert stats["reserved_peak_bytes"] == 20 * MIB + 64 * MIB
    # A later, higher peak after the reset replaces the lifetime one.
    double.free(double.malloc(100 * MIB))
    src.reset_peak()
    assert src.stats()["allocated_peak_bytes"] == 102 * MIB
    double.free(keep)


def test_reset_is_skipped_when_stats_cannot_be_read() -> None:
    double = ScriptedCudaAllocatorDouble()

    def broken(index: int) -> dict[str, Any]:
        return {"allocated_bytes": {"all": {"peak": "garbage"}}}

    src = CudaAllocatorSource(0, stats_fn=broken, reset_peak_fn=double.reset_peak)
    with pytest.raises(ValueError):
        src.reset_peak()
    assert double.reset_peak_calls == 0


def test_reading_reads_the_stats_once() -> None:
    double = ScriptedCudaAllocatorDouble()
    calls: list[int] = []

    def counting(index: int) -> dict[str, Any]:
        calls.append(index)
        return double.memory_stats_nested(index)

    src = CudaAllocatorSource(0, stats_fn=counting, reset_peak_fn=double.reset_peak)
    double.malloc(3 * MIB)
    r = src.reading()
    assert calls == [0]
    assert (r.allocated, r.reserved, r.peak, r.allocations, r.frees) == (3 * MIB, 20 * MIB, 3 * MIB, 1, 0)


def test_oom_after_retry_counts_a_retry_and_an_oom() -> None:
    double = ScriptedCudaAllocatorDouble(capacity_bytes=30 * MIB)
    src = _source(double)
    double.malloc(20 * MIB)
    with pytest.raises(torch.OutOfMemoryError):
        double.malloc(20 * MIB)
    f = src.stats()
    assert (f["alloc_retries"], f["ooms"]) == (1, 1)
    assert f["allocated_bytes"] == 20 * MIB     # the failed request left no trace


def test_retry_that_frees_the_cache_succeeds_without_an_oom() -> None:
    double = ScriptedCudaAllocatorDouble(capacity_bytes=30 * MIB)
    src = _source(double)
    double.free(double.malloc(12 * MIB))         # cached, whole segment
    double.malloc(20 * MIB)                      # does not fit beside it until it is released
    f = src.stats()
    assert (f["alloc_retries"], f["ooms"]) == (1, 0)
    assert f["reserved_bytes"] == 20 * MIB


def test_concurrent_resets_never_lose_the_lifetime_peak() -> None:
    double = ScriptedCudaAllocatorDouble()
    src = _source(double)
    double.free(double.malloc(50 * MIB))
    threads = [threading.Thread(target=lambda: [src.reset_peak() for _ in range(200)])
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert src.stats()["allocated_peak_bytes"] == 50 * MIB
    assert src.peak_since_reset() == 0


# -- this machine has no CUDA ---------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_no_cuda_devices_here() -> None:
    assert available_devices() == []
    assert CudaAllocatorSource.available_devices() == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_default_source_without_cuda_raises_source_unavailable_with_reason() -> None:
    with pytest.raises(SourceUnavailable, match=r"cuda:0: .*(without CUDA|is_available)"):
        CudaAllocatorSource(0)


@pytest.mark.parametrize("bad", [-1, True, 1.0, "0"])
def test_bad_device_index_is_rejected(bad: Any) -> None:
    with pytest.raises(ValueError):
        CudaAllocatorSource(bad, stats_fn=lambda i: {}, reset_peak_fn=lambda i: None)


# -- CudaPeakWatch: per-layer reads that never reset torch's peak register ----------------------

def _watch() -> tuple[ScriptedCudaAllocatorDouble, Any]:
    from memprof_otel.sources.cuda import CudaPeakWatch

    dev = ScriptedCudaAllocatorDouble(0)
    src = CudaAllocatorSource(0, stats_fn=dev.memory_stats_nested, reset_peak_fn=dev.reset_peak)
    return dev, CudaPeakWatch(src)


def test_peak_watch_reports_a_new_all_time_peak_exactly_and_never_resets() -> None:
    dev, watch = _watch()
    watch.reset_peak()
    h = dev.malloc(64 * MIB)  # a transient above every earlier peak
    dev.free(h)
    keep = dev.malloc(2 * MIB)
    r = watch.read_and_reset()
    assert r.peak == 64 * MIB and r.allocated == 2 * MIB
    assert dev.reset_peak_calls == 0
    assert dev.memory_stats_nested(0)["allocated_bytes"]["all"]["peak"] == 64 * MIB
    dev.free(keep)


def test_peak_watch_below_an_earlier_peak_reports_the_level_a_lower_bound() -> None:
    dev, watch = _watch()
    dev.free(dev.malloc(64 * MIB))  # the host's earlier peak (say, a profiling run)
    watch.reset_peak()
    dev.free(dev.malloc(16 * MIB))  # a smaller transient: the register cannot show it
    r = watch.read_and_reset()
    assert r.peak == r.allocated == 0
    assert dev.reset_peak_calls == 0


def test_peak_watch_treats_a_host_reset_as_no_rise() -> None:
    dev, watch = _watch()
    dev.free(dev.malloc(64 * MIB))
    watch.reset_peak()
    dev.reset_peak(0)            # the host application resets torch's counters itself
    dev.free(dev.malloc(8 * MIB))
    assert watch.read_and_reset().peak == 0  # 8 MiB < the 64 MiB mark: not claimed as ours
    dev.free(dev.malloc(32 * MIB))           # now the register rose past its new mark (8 MiB)
    assert watch.read_and_reset().peak == 32 * MIB
