"""The CUDA attribution path (allocator counters, window splitting over the device peak
register) driven end to end through real module hooks, with the device replaced by
``ScriptedCudaAllocatorDouble`` — a test double, since this machine has no GPU."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import memprof_otel as mp
import memprof_otel.attribution.torch.instrumentation as instrument_mod
from memprof_otel.sources import registry
from memprof_otel.sources.cuda import CudaAllocatorSource
from tests.doubles.cuda_allocator_double import MIB, ScriptedCudaAllocatorDouble, round_size

EVERY = {"every_n_forwards": 1, "overhead_budget": 1.0}


class DeviceOp(nn.Module):
    """Scripts device allocations: a transient of ``temp`` bytes and ``keep`` bytes it retains."""

    def __init__(self, dev: ScriptedCudaAllocatorDouble, temp: int, keep: int) -> None:
        super().__init__()
        self.dev, self.temp, self.keep = dev, temp, keep
        self.kept: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dev.malloc(self.temp)
        self.dev.free(h)
        if self.keep:
            self.kept.append(self.dev.malloc(self.keep))
        return x


class DeviceNet(nn.Module):
    def __init__(self, dev: ScriptedCudaAllocatorDouble) -> None:
        super().__init__()
        self.dev = dev
        self.a = DeviceOp(dev, 8 * MIB, 1 * MIB)
        self.b = nn.Sequential(DeviceOp(dev, 64 * MIB, 2 * MIB), DeviceOp(dev, 4 * MIB, 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dev.malloc(100 * MIB)  # the root's own transient, before any child, the largest
        self.dev.free(h)
        return self.b(self.a(x))


@pytest.fixture
def device(monkeypatch):
    dev = ScriptedCudaAllocatorDouble(0)
    src = CudaAllocatorSource(0, stats_fn=dev.memory_stats_nested, reset_peak_fn=dev.reset_peak)
    monkeypatch.setattr(instrument_mod, "_module_device", lambda m: torch.device("cuda", 0))
    monkeypatch.setattr(registry, "cuda_allocator", lambda index: src if index == 0 else None)
    return dev, src


def test_cuda_path_attributes_transients_with_window_splitting(device):
    dev, src = device
    model = DeviceNet(dev)
    with mp.instrument(model, **EVERY) as h:
        model(torch.zeros(1))
        s = h.layer_stats()
    assert s["a"].peak_increase == round_size(8 * MIB)
    assert s["a"].retained == round_size(1 * MIB)
    assert s["b.0"].peak_increase == round_size(64 * MIB)
    assert s["b.1"].peak_increase == round_size(4 * MIB)
    assert s["b"].peak_increase == round_size(64 * MIB)
    # the root's 100 MiB transient came before the children: not lost to their peak resets
    assert s[""].peak_increase == round_size(100 * MIB)
    assert s[""].retained == round_size(1 * MIB) + round_size(2 * MIB)
    assert s["a"].total_allocations == 2 and s["a"].total_deallocations == 1
    assert s["b"].peak_reserved >= s["b"].peak_allocated > 0
    assert 0.0 <= s["b.1"].avg_fragmentation <= 1.0
    assert h.summary_dict()["method"] == "cuda caching allocator"


def test_cuda_lifetime_peak_survives_per_layer_resets(device):
    dev, src = device
    model = DeviceNet(dev)
    with mp.instrument(model, **EVERY):
        model(torch.zeros(1))
    # the device's own peak register was reset by every hook; the source folded it first
    assert src.stats()["allocated_peak_bytes"] >= round_size(100 * MIB)
    assert dev.reset_peak_calls > 5


def test_cuda_stats_failure_is_counted_and_forward_runs(device, monkeypatch):
    dev, src = device
    model = DeviceNet(dev)

    def broken(index: int) -> dict:
        raise RuntimeError("driver went away")

    with mp.instrument(model, **EVERY) as h:
        monkeypatch.setattr(src, "_stats_fn", broken)
        out = model(torch.ones(1))
        assert torch.equal(out, torch.ones(1))
        assert h.hook_errors >= 1


@pytest.fixture
def history(device, monkeypatch):
    """Captures on the scripted device record history through the double's stand-ins."""
    from memprof_otel.sources.cuda_history import CudaHistoryRecorder

    dev, _ = device
    made: list[CudaHistoryRecorder] = []

    def recorder(index: int, max_entries: int) -> CudaHistoryRecorder:
        made.append(CudaHistoryRecorder(index, max_entries, record_fn=dev.record_memory_history,
                                        snapshot_fn=dev.snapshot))
        return made[-1]
    monkeypatch.setattr(registry, "cuda_history_recorder", recorder)
    return dev, made


def _allocs(snapshot):
    return [e for e in snapshot["device_traces"][0] if e["action"] == "alloc"]


def test_cuda_history_is_recorded_only_inside_the_capture_window(history, tmp_path):
    # GIVEN a CUDA model (scripted device) with a dump directory
    dev, made = history
    mp.start_monitoring({"sampler": {"interval": "50ms"}, "dumps": {"dir": str(tmp_path)}})
    model = DeviceNet(dev)
    with mp.instrument(model, **EVERY) as h:
        model(torch.zeros(1))  # a plain attributed forward: no history
        assert not made and not dev.recording

        # WHEN two forwards are deep-captured, with forwards before and after
        cap = h.capture(forwards=2)
        model(torch.zeros(1))
        assert dev.recording  # on during the window
        model(torch.zeros(1))
        assert cap.wait(5) and not dev.recording  # off as soon as the window closes
        model(torch.zeros(1))

    # THEN exactly the window's allocations are in the snapshot: 6 mallocs per forward (root 1, a 2,
    # b.0 2, b.1 1) x 2 forwards, with the bound and the device passed through
    assert len(made) == 1
    assert [c["enabled"] for c in dev.record_calls] == ["all", None]
    assert dev.record_calls[0]["max_entries"] == 100_000 and dev.record_calls[0]["device"] == 0
    assert len(_allocs(cap.cuda_snapshot)) == 2 * 6
    assert cap.cuda_snapshot["segments"]


def test_cuda_history_is_bounded_and_stored_beside_the_dump(history, tmp_path):
    dev, made = history
    mp.start_monitoring({"sampler": {"interval": "50ms"},
                         "dumps": {"dir": str(tmp_path), "cuda_history_max_entries": 3}})
    model = DeviceNet(dev)
    import threading

    from memprof_otel.runtime import runtime

    with mp.instrument(model, name="devnet", **EVERY):
        stop = threading.Event()

        def traffic() -> None:
            while not stop.is_set():
                model(torch.zeros(1))
                stop.wait(0.005)
        t = threading.Thread(target=traffic)
        t.start()
        try:
            info = runtime().dump_service.capture("devnet", forwards=1, timeout=10)
        finally:
            stop.set()
            t.join()
    snap_info = runtime().dump_service.related[info.id]
    assert snap_info.kind == "cuda_snapshot" and snap_info.model == "devnet"
    import json

    stored = json.loads(runtime().dump_service.store.read(snap_info.id))
    assert len(stored["device_traces"][0]) == 3  # the last 3 events only
    assert not dev.recording


def test_a_failing_history_recorder_never_breaks_the_capture_or_the_forward(history, monkeypatch):
    dev, made = history

    def broken(**kwargs):
        raise RuntimeError("record_memory_history is not available")
    monkeypatch.setattr(dev, "record_memory_history", broken)
    model = DeviceNet(dev)
    with mp.instrument(model, **EVERY) as h:
        cap = h.capture(forwards=1)
        out = model(torch.ones(1))
        assert cap.wait(5)
    assert torch.equal(out, torch.ones(1))
    assert cap.cuda_snapshot is None and made[0].error is not None
    assert cap.completed == 1 and cap.total_bytes() >= 0
