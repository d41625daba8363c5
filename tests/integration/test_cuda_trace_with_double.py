"""Attributed CUDA forwards over the allocator trace (``cuda.attribution: trace``), through real
module hooks, with the device replaced by ``ScriptedCudaAllocatorDouble`` — a test double, since
this machine has no GPU. The reference for every figure is the same script measured the old way
(an allocator read at every boundary) or plain arithmetic on the scripted sizes."""
from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch import nn

import memprof_otel as mp
import memprof_otel.attribution.torch.instrumentation as instrument_mod
from memprof_otel.capacity.memory_budget_reader import MemoryBudgetReader
from memprof_otel.telemetry.scrape import layer_view as _layer_view
from memprof_otel.sources import in_flight_levels, registry
from memprof_otel.sources.cuda import CudaAllocatorSource
from memprof_otel.sources.cuda_trace import CudaAllocatorTrace
from memprof_otel.telemetry.series import SelfView, build_series
from tests.doubles.cuda_allocator_double import MIB, ScriptedCudaAllocatorDouble, round_size
from tests.integration.test_cuda_path_with_double import DeviceNet, DeviceOp

EVERY = {"every_n_forwards": 1, "overhead_budget": 1.0, "cuda": {"attribution": "trace"}}
READS = {"every_n_forwards": 1, "overhead_budget": 1.0, "cuda": {"attribution": "boundary_reads"}}


class CountingSource(CudaAllocatorSource):
    """The real source over the double, counting its statistics reads."""

    def __init__(self, dev: ScriptedCudaAllocatorDouble) -> None:
        self.reads = 0

        def stats(index: int) -> dict[str, Any]:
            self.reads += 1
            return dev.memory_stats_nested(index)
        super().__init__(0, stats_fn=stats, reset_peak_fn=dev.reset_peak)


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> tuple[ScriptedCudaAllocatorDouble, CountingSource, CudaAllocatorTrace]:
    dev = ScriptedCudaAllocatorDouble(0)
    src = CountingSource(dev)
    trace = CudaAllocatorTrace(10_000, fns=dev.trace_fns())
    monkeypatch.setattr(instrument_mod, "_tensor_device", lambda t: torch.device("cuda", 0))
    monkeypatch.setattr(registry, "cuda_allocator", lambda index: src if index == 0 else None)
    monkeypatch.setattr(registry, "cuda_trace", lambda max_entries: trace)
    monkeypatch.setattr(registry, "cuda_trace_in_flight", lambda: trace.in_flight)
    return dev, src, trace


def _figures(h: Any) -> dict[str, tuple[int, int, int, int]]:
    return {k: (v.peak_increase, v.retained, v.total_allocations, v.total_deallocations)
            for k, v in h.layer_stats().items()}


def test_traced_forward_equals_boundary_reads_and_reads_once(device) -> None:
    dev, src, trace = device
    model = DeviceNet(dev)
    with mp.instrument(model, name="reads", **READS) as h:
        model(torch.zeros(1))
        by_reads = _figures(h)
    resets = dev.reset_peak_calls
    reads_before = src.reads
    with mp.instrument(model, name="traced", **EVERY) as h:
        model(torch.zeros(1))
        traced = _figures(h)
        s = h.layer_stats()
    assert traced == by_reads
    # the arithmetic of the script, as the per-boundary test has it
    assert traced["b.0"][:2] == (round_size(64 * MIB), round_size(2 * MIB))
    assert traced[""][0] == round_size(100 * MIB)
    # one statistics read for the whole forward (the base level), one snapshot, no peak reset
    assert src.reads - reads_before == 1 and dev.snapshot_calls == 1
    assert dev.reset_peak_calls == resets
    assert all(v.avg_fragmentation is None for v in s.values())
    # the ring is armed cleared, without stacks, only while the forward runs
    assert [c["enabled"] for c in dev.record_calls] == ["all", None]
    assert dev.record_calls[0]["clear_history"] and dev.record_calls[0]["context"] is None
    assert not dev.recording and trace.in_flight == 0


def test_layer_peak_allocated_is_offset_by_the_level_at_the_start(device) -> None:
    dev, _src, _trace = device
    held = dev.malloc(300 * MIB)  # allocated before the forward: the base level
    model = DeviceNet(dev)
    with mp.instrument(model, **EVERY) as h:
        model(torch.zeros(1))
        s = h.layer_stats()
    assert s[""].peak_allocated == round_size(300 * MIB) + round_size(100 * MIB)
    dev.free(held)


class _Lockstep(nn.Module):
    """Allocates ``size`` and frees it while the other thread's twin holds its own block: with one
    device-wide counter each would see the other's bytes as its own."""

    def __init__(self, dev: ScriptedCudaAllocatorDouble, size: int, barrier: threading.Barrier) -> None:
        super().__init__()
        self.dev, self.size, self.barrier = dev, size, barrier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dev.malloc(self.size)
        self.barrier.wait(5)  # both hold their block now
        self.barrier.wait(5)
        self.dev.free(h)
        return x


def _two_threads(dev: ScriptedCudaAllocatorDouble, config: dict[str, Any]) -> list[Any]:
    barrier = threading.Barrier(2)
    models = [nn.Sequential(_Lockstep(dev, size, barrier)) for size in (8 * MIB, 48 * MIB)]
    handles = [mp.instrument(m, name=f"lockstep-{i}", **config) for i, m in enumerate(models)]
    errors: list[BaseException] = []

    def run(m: nn.Module) -> None:
        try:
            for _ in range(3):
                m(torch.zeros(1))
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)
    threads = [threading.Thread(target=run, args=(m,)) for m in models]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    return handles


def test_two_threads_on_one_device_each_get_their_own_figures(device) -> None:
    dev, _src, trace = device
    h8, h48 = _two_threads(dev, EVERY)
    try:
        assert h8.layer_stats()["0"].peak_increase == round_size(8 * MIB)
        assert h48.layer_stats()["0"].peak_increase == round_size(48 * MIB)
        assert h8.unattributed == {} and h48.unattributed == {}
        assert trace.in_flight == 0 and not dev.recording
    finally:
        h8.uninstrument()
        h48.uninstrument()


def test_boundary_reads_drop_overlapping_forwards_and_count_them(device) -> None:
    dev, _src, _trace = device
    h8, h48 = _two_threads(dev, READS)
    try:
        # every forward overlapped the other thread's: no figure rather than a wrong one
        assert h8.layer_stats() == {} and h48.layer_stats() == {}
        assert h8.unattributed == {"concurrent": 3} and h48.unattributed == {"concurrent": 3}
        # and the count reaches the exported series
        series = build_series(None, [_layer_view(h8)], SelfView())
        assert series["memprof_forwards_unattributed_total"] == [({"model": "lockstep-0", "reason": "concurrent"}, 3),
                                                                 ({"model": "lockstep-0", "reason": "trace_lost"}, 0)]
    finally:
        h8.uninstrument()
        h48.uninstrument()


def test_a_wrapped_ring_drops_the_forward_and_counts_it(device, monkeypatch: pytest.MonkeyPatch) -> None:
    dev, _src, _trace = device
    small = CudaAllocatorTrace(4, fns=dev.trace_fns())  # fewer entries than one forward makes
    monkeypatch.setattr(registry, "cuda_trace", lambda max_entries: small)
    model = DeviceNet(dev)
    with mp.instrument(model, **EVERY) as h:
        model(torch.zeros(1))
        assert h.layer_stats() == {} and h.unattributed == {"trace_lost": 1}
    assert small.in_flight == 0 and not dev.recording


def test_history_recorded_by_someone_else_is_left_alone(device) -> None:
    dev, src, trace = device
    dev.record_memory_history("all", "all", max_entries=50_000)  # the application debugging memory
    model = DeviceNet(dev)
    with mp.instrument(model, **EVERY) as h:
        model(torch.zeros(1))
        s = h.layer_stats()
    # measured the other way (boundary reads), the application's recording untouched
    assert s["b.0"].peak_increase == round_size(64 * MIB) and dev.reset_peak_calls > 0
    assert dev.recording and [c["enabled"] for c in dev.record_calls] == ["all"]
    assert trace.refused == 1


def test_a_module_that_raises_still_gives_the_trace_back(device) -> None:
    dev, _src, trace = device

    class Boom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            dev.malloc(1 * MIB)
            raise ValueError("boom")

    model = nn.Sequential(DeviceOp(dev, 2 * MIB, 0), Boom())
    with mp.instrument(model, **EVERY) as h:
        with pytest.raises(ValueError):
            model(torch.zeros(1))
        assert h.layer_stats()["1"].retained == round_size(1 * MIB)
    assert trace.in_flight == 0 and not dev.recording


class _Probe(nn.Module):
    """Holds 32 MiB while it reads the budget, as a scrape landing mid-forward does."""

    def __init__(self, dev: ScriptedCudaAllocatorDouble, reader: MemoryBudgetReader) -> None:
        super().__init__()
        self.dev, self.reader = dev, reader
        self.seen: Any = None
        self.allocated_mid = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dev.malloc(32 * MIB)
        self.allocated_mid = self.dev.memory_stats_nested(0)["allocated_bytes"]["all"]["current"]
        self.seen = self.reader.read("cuda:0")[0]
        self.dev.free(h)
        return x


def test_a_budget_read_mid_traced_forward_counts_the_level_at_its_start(device) -> None:
    """A traced forward reads the allocator once, at its start: that level is the one a budget read
    meanwhile counts as in use (its transient would count twice), with no read of its own."""
    dev, src, _ = device
    weights = dev.malloc(16 * MIB)
    reader = MemoryBudgetReader(0.0, 0, ttl_s=0.0, limit_bytes=1 << 30)  # a limit of our own: no device info here
    model = _Probe(dev, reader)
    try:
        with mp.instrument(model, name="traced-probe", **EVERY):
            level = dev.memory_stats_nested(0)["allocated_bytes"]["all"]["current"]
            model(torch.zeros(2, 8))
        assert model.allocated_mid >= level + 32 * MIB  # the transient was there ...
        assert model.seen.limit == "configured" and model.seen.in_use_bytes == level  # ... and not counted
        assert in_flight_levels.shared().start("cuda:0") is None
    finally:
        dev.free(weights)
