"""The memory breakdown's arithmetic: parts that sum to the total, storages counted once, and the CUDA
breakdown over the scripted allocator double and the scripted NVML (what the sources would read)."""
from __future__ import annotations

import os

import pytest

from memprof_otel.sources.cuda import CudaAllocatorSource
from memprof_otel.sources.nvml import NvmlSource
from memprof_otel.telemetry.breakdown_service import MemoryBreakdownWatch, NoBreakdownSources
from memprof_otel.telemetry.memory_breakdown import (COMPONENTS, Held, cpu_breakdown, cuda_breakdown, merge_held,
                                                     series_rows)
from memprof_otel.timeline import Sample
from tests.doubles.cuda_allocator_double import MIB, ScriptedCudaAllocatorDouble
from tests.doubles.nvml_double import ScriptedGpu, ScriptedNvmlDouble

GIB = 1024 * MIB
ME = os.getpid()
UUID0 = "GPU-11111111-2222-3333-4444-555555555555"


def held(weights: dict[str, int] | None = None, kv: dict[str, int] | None = None) -> Held:
    return Held(weights or {}, kv or {}, 1, (), 100.0)


def cpu_sample(**process: float) -> Sample:
    base = {"resident_memory_bytes": 1000 * MIB, "rss_file_bytes": 200 * MIB, "rss_shmem_bytes": 4 * MIB,
            "rss_anon_bytes": 796 * MIB}
    base.update(process)
    glibc = {"allocated_bytes": 600 * MIB, "reserved_bytes": 650 * MIB}
    return Sample(t=100.0, process=base, allocators={"cpu": glibc},
                  container={"memory_working_set_bytes": 1200 * MIB})


def test_cpu_parts_and_unexplained_sum_to_rss_and_tensors_are_taken_out_of_the_heap_once():
    b = cpu_breakdown(cpu_sample(), held({"cpu": 300 * MIB}, {"cpu": 50 * MIB}), (40 * MIB, 99.0))
    assert b is not None and b.total_source == "rss" and b.total_bytes == 1000 * MIB
    parts = {c.name: c.bytes for c in b.components}
    assert parts == {"weights": 300 * MIB, "kv_cache": 50 * MIB, "heap_in_use": 250 * MIB,
                     "heap_free": 50 * MIB, "python_heap": 40 * MIB, "file_backed": 200 * MIB,
                     "shared_memory": 4 * MIB}
    assert sum(parts.values()) + b.unexplained_bytes == b.total_bytes
    assert b.unexplained_bytes == (1000 - 894) * MIB
    assert b.other_totals == {"cgroup_working_set": 1200 * MIB}
    doc = b.to_dict(now=101.0)
    assert doc["measured"]["python_heap"]["age_seconds"] == pytest.approx(2.0)
    assert doc["measured"]["heap_in_use"]["age_seconds"] == pytest.approx(1.0)
    assert any("ledger" in n for n in doc["notes"])  # CPU tensors outside weights: said not measured


def test_cpu_without_glibc_or_python_heap_says_so_and_leaves_them_in_unexplained():
    s = Sample(t=1.0, process={"resident_memory_bytes": 100.0, "rss_file_bytes": 30.0, "rss_shmem_bytes": 0.0})
    b = cpu_breakdown(s, held(), None, "this interpreter exports no _PyObject_DebugMallocStats")
    assert b is not None
    assert {c.name for c in b.components} == {"weights", "kv_cache", "file_backed", "shared_memory"}
    assert b.unexplained_bytes == 70
    assert any("glibc" in n for n in b.notes) and any("_PyObject_DebugMallocStats" in n for n in b.notes)
    assert cpu_breakdown(Sample(t=1.0, process={}), held(), None) is None  # no RSS: no CPU breakdown


def test_weights_larger_than_the_heap_are_flagged_not_subtracted_below_zero():
    b = cpu_breakdown(cpu_sample(), held({"cpu": 700 * MIB}), None)
    assert b is not None and b.component("heap_in_use") == 0
    assert any("exceed glibc" in n for n in b.notes)


def test_merge_counts_a_shared_storage_once_and_a_weight_never_as_cache():
    a = {"weights": {("cpu", 1): 10, ("cpu", 2): 20}, "kv_cache": {("cpu", 9): 5}}
    b = {"weights": {("cpu", 2): 20, ("cuda:0", 1): 7}, "kv_cache": {("cpu", 1): 10, ("cuda:0", 3): 4}}
    h = merge_held([("a", a), ("b", b), ("keras", {})], 5.0)
    assert h.weights == {"cpu": 30, "cuda:0": 7}        # storage ("cpu", 2) of both models once
    assert h.kv_cache == {"cpu": 5, "cuda:0": 4}        # ("cpu", 1) is a weight of model a
    assert h.models == 2 and h.uncounted == ("keras",)


def _cuda(double: ScriptedCudaAllocatorDouble) -> dict[str, float]:
    return CudaAllocatorSource(0, stats_fn=double.memory_stats_nested, reset_peak_fn=double.reset_peak).stats()


def test_cuda_parts_over_the_allocator_double_and_nvml_sum_to_the_driver_figure():
    dev = ScriptedCudaAllocatorDouble()
    weights = [dev.malloc(64 * MIB) for _ in range(4)]          # 256 MiB of weights
    kv = dev.malloc(32 * MIB)
    act = [dev.malloc(3 * MIB) for _ in range(10)]               # 1-10 MiB: carved from 20 MiB segments
    for handle in act[::2]:
        dev.free(handle)                                         # freed blocks stay cached
    figures = _cuda(dev)
    allocated, reserved = int(figures["allocated_bytes"]), int(figures["reserved_bytes"])
    assert reserved > allocated  # the double cached something: the allocator cache is not empty
    context = 500 * MIB
    nvml = NvmlSource(nvml=ScriptedNvmlDouble([ScriptedGpu(UUID0, used_script=(reserved + context,),
                                                            compute_processes=[(ME, reserved + context)])]), pid=ME)
    (gpu,) = nvml.readings()
    b = cuda_breakdown("cuda:0", figures, 10.0, held({"cuda:0": 256 * MIB}, {"cuda:0": 32 * MIB}), gpu)
    parts = {c.name: c.bytes for c in b.components}
    assert b.total_source == "nvml_process" and b.total_bytes == reserved + context
    assert parts["weights"] == 256 * MIB and parts["kv_cache"] == 32 * MIB
    # independent of the breakdown: the blocks still held, rounded as the allocator rounds
    assert parts["activations_other"] == allocated - 288 * MIB == 5 * 3 * MIB
    assert parts["allocator_cache"] == reserved - allocated
    assert parts["non_torch"] == context
    assert b.unexplained_bytes == 0 and sum(parts.values()) == b.total_bytes
    assert b.details["allocator_cache_fragmented"] == int(figures["inactive_split_bytes"])
    # empty_cache() gives the free segments back: the cache part shrinks by what reserved lost
    dev.empty_cache()
    after = _cuda(dev)
    b2 = cuda_breakdown("cuda:0", after, 11.0, held({"cuda:0": 256 * MIB}, {"cuda:0": 32 * MIB}), gpu)
    assert (b.component("allocator_cache") or 0) - (b2.component("allocator_cache") or 0) == \
        reserved - int(after["reserved_bytes"])
    del weights, kv


def test_cuda_without_nvml_falls_back_to_mem_get_info_then_to_reserved():
    dev = ScriptedCudaAllocatorDouble()
    dev.malloc(100 * MIB)
    figures = _cuda(dev)
    reserved = int(figures["reserved_bytes"])
    b = cuda_breakdown("cuda:0", figures, 1.0, held(), None, (40 * GIB - reserved - GIB, 40 * GIB))
    assert b.total_source == "cuda_mem_get_info" and b.component("non_torch") == GIB
    assert any("every process" in n for n in b.notes)
    b = cuda_breakdown("cuda:0", figures, 1.0, held(), None, None)
    assert b.total_source == "allocator_reserved" and b.total_bytes == reserved
    assert b.component("non_torch") is None and b.unexplained_bytes == 0


class _Handle:
    def __init__(self, held_tensors: dict) -> None:
        self._held = held_tensors

    def held_tensors(self) -> dict:
        return self._held


def test_the_watch_matches_cuda_devices_to_nvml_by_uuid_and_exports_every_part():
    dev = ScriptedCudaAllocatorDouble()
    dev.malloc(40 * MIB)
    figures = _cuda(dev)
    reserved = int(figures["reserved_bytes"])
    nvml = NvmlSource(nvml=ScriptedNvmlDouble([ScriptedGpu(UUID0, used_script=(reserved + 300 * MIB,),
                                                            compute_processes=[(ME, reserved + 300 * MIB)])]), pid=ME)
    sample = Sample(t=50.0, process={"resident_memory_bytes": 100 * MIB}, allocators={"cuda:0": figures},
                    gpus=nvml.readings())
    class TorchUuids(NoBreakdownSources):
        def cuda_uuids(self) -> dict[int, str]:
            return {0: UUID0[len("GPU-"):]}

    watch = MemoryBreakdownWatch(lambda: {"m": _Handle({"weights": {("cuda:0", 1): 40 * MIB}})},
                                 TorchUuids(), clock=lambda: 51.0)
    watch.on_sample(sample)
    doc = watch.document()
    cuda = doc["devices"]["cuda:0"]
    assert cuda["total_source"] == "nvml_process" and cuda["components"]["non_torch"] == 300 * MIB
    assert cuda["components"]["weights"] == 40 * MIB and cuda["age_seconds"] == pytest.approx(1.0)
    rows = series_rows(watch.breakdowns().values())
    comps = {(lab["device"], lab["component"]) for lab, _ in rows["memprof_memory_bytes"]}
    assert ("cuda:0", "unexplained") in comps and ("cpu", "unexplained") in comps
    assert {c for _, c in comps} <= set(COMPONENTS)
    for device in ("cpu", "cuda:0"):  # each device's parts sum to its total
        parts = sum(v for lab, v in rows["memprof_memory_bytes"] if lab["device"] == device)
        assert parts == doc["devices"][device]["total_bytes"]


def test_a_handle_that_fails_leaves_its_weights_uncounted_not_the_breakdown():
    class Broken:
        def held_tensors(self) -> dict:
            raise RuntimeError("boom")

    watch = MemoryBreakdownWatch(lambda: {"bad": Broken(), "ok": _Handle({"weights": {("cpu", 1): 8}})})
    watch.on_sample(Sample(t=1.0, process={"resident_memory_bytes": 100.0}))
    cpu = watch.breakdowns()["cpu"]
    assert cpu.component("weights") == 8 and any("bad" in n for n in cpu.notes)
    assert watch.document()["devices"]["cpu"]["total_bytes"] == 100


def test_no_tick_yet_gives_no_device_and_the_reason():
    doc = MemoryBreakdownWatch(dict).document()
    assert doc["devices"] == {} and "tick" in doc["reason"]
