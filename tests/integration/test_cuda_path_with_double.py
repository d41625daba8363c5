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
    monkeypatch.setattr(instrument_mod, "_tensor_device", lambda t: torch.device("cuda", 0))
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


# ---- cuda.reset_peak_stats: false — torch's peak counters stay the host application's ----------
#
# The host (vLLM's start-up profiling does this) resets torch's peak counters, runs a profile
# forward and reads max_memory_allocated() afterwards. Here the scripted device stands in for the
# GPU, and this machine's CPU tensors for the tensors a CUDA forward creates: the tensor ledger is
# told to count CPU storages where it would count CUDA ones (the only substitution).

class TensorOp(nn.Module):
    """A layer that creates tensors of known sizes: a ``temp``-byte transient, then ``keep`` bytes
    it retains; the device allocations mirror them so the device's own register moves too."""

    def __init__(self, dev: ScriptedCudaAllocatorDouble, temp: int, keep: int) -> None:
        super().__init__()
        self.dev, self.temp, self.keep = dev, temp, keep
        self.kept: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.empty(self.temp, dtype=torch.uint8)
        h = self.dev.malloc(self.temp)
        del t
        self.dev.free(h)
        if self.keep:
            self.kept.append(torch.empty(self.keep, dtype=torch.uint8))
            self.dev.malloc(self.keep)
        return x


class TensorNet(nn.Module):
    def __init__(self, dev: ScriptedCudaAllocatorDouble) -> None:
        super().__init__()
        self.dev = dev
        self.a = TensorOp(dev, 3 * MIB, 1 * MIB)
        self.b = nn.Sequential(TensorOp(dev, 5 * MIB, 2 * MIB), TensorOp(dev, 1 * MIB, 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.empty(7 * MIB, dtype=torch.uint8)  # the root's own transient, before any child
        h = self.dev.malloc(7 * MIB)
        del t
        self.dev.free(h)
        return self.b(self.a(x))


@pytest.fixture
def cpu_tensors_stand_in_for_cuda(monkeypatch):
    from memprof_otel.sources.ledger import TensorLedger

    monkeypatch.setattr(instrument_mod, "TensorLedger", lambda device_type: TensorLedger("cpu"))


def host_profiles(dev: ScriptedCudaAllocatorDouble, nbytes: int) -> int:
    """What the host does before serving: reset the peak counters, run a profile allocation, read
    ``max_memory_allocated()`` (the double's nested ``allocated_bytes.all.peak``)."""
    dev.reset_peak(0)
    dev.free(dev.malloc(nbytes))
    return dev.memory_stats_nested(0)["allocated_bytes"]["all"]["peak"]


def test_no_reset_mode_leaves_the_hosts_peak_alone_and_figures_right(device, cpu_tensors_stand_in_for_cuda):
    # GIVEN a host that profiled a 256 MiB peak, and a model whose forwards peak far lower
    dev, src = device
    host_max = host_profiles(dev, 256 * MIB)
    assert host_max == round_size(256 * MIB)
    resets_before = dev.reset_peak_calls
    model = TensorNet(dev)

    # WHEN forwards run attributed, in the mode that never resets torch's peak counters
    with mp.instrument(model, reset_peak_stats=False, **EVERY) as h:
        level_at_start = src.allocated()
        model(torch.zeros(1))
        model(torch.zeros(1))
        s = h.layer_stats()
        stats = src.stats()  # the sampler's read: no reset either

    # THEN torch's reset was never called by us and the host's max_memory_allocated() is untouched
    assert dev.reset_peak_calls == resets_before
    assert dev.memory_stats_nested(0)["allocated_bytes"]["all"]["peak"] == host_max
    assert stats["allocated_peak_bytes"] == host_max
    # AND per-layer figures are the tensor sizes (first forward's and second's are alike)
    assert s["a"].peak_increase == 3 * MIB and s["a"].retained == 1 * MIB
    assert s["b.0"].peak_increase == 5 * MIB and s["b.0"].retained == 2 * MIB
    assert s["b.1"].peak_increase == 1 * MIB and s["b.1"].retained == 0
    assert s["b"].peak_increase == 2 * MIB + 3 * MIB and s["b"].retained == 2 * MIB  # b.0's keep stays
    assert s[""].peak_increase == 7 * MIB and s[""].retained == 3 * MIB
    assert s["a"].calls == 2
    # absolute levels are the allocator's level at forward start plus the tensor bytes above it:
    # the second forward starts with the first one's kept 1 + 2 MiB on the device
    assert level_at_start == 0
    assert s[""].peak_allocated == (1 * MIB + 2 * MIB) + 7 * MIB
    assert s["a"].avg_fragmentation is None  # the ledger has no heap layout: absent, not 0


def test_default_mode_resets_the_hosts_peak_which_is_why_the_switch_exists(device):
    dev, src = device
    host_max = host_profiles(dev, 256 * MIB)
    resets_before = dev.reset_peak_calls
    model = DeviceNet(dev)
    with mp.instrument(model, **EVERY):
        model(torch.zeros(1))
    assert dev.reset_peak_calls > resets_before
    # the host's max_memory_allocated() now reads our last layer's window, not its profile peak
    assert dev.memory_stats_nested(0)["allocated_bytes"]["all"]["peak"] < host_max
    assert src.stats()["allocated_peak_bytes"] >= host_max  # our own lifetime figure survived


def test_no_reset_mode_on_a_compiled_style_forward_only_watches_the_register(device, monkeypatch):
    # GIVEN the path taken for forwards the ledger cannot see into (compiled code, or a torch
    # without dispatch modes)
    dev, src = device
    monkeypatch.setattr(instrument_mod, "_LEDGER_DOWN", "no dispatch modes in this torch (test)")
    host_max = host_profiles(dev, 32 * MIB)
    resets_before = dev.reset_peak_calls
    model = DeviceNet(dev)  # its root allocates a 100 MiB transient: above the host's peak
    with mp.instrument(model, reset_peak_stats=False, **EVERY) as h:
        model(torch.zeros(1))
        s = h.layer_stats()
    assert dev.reset_peak_calls == resets_before
    # the new all-time peak is exact: the root transient of 100 MiB over the level at entry
    assert s[""].peak_increase == round_size(100 * MIB)
    assert dev.memory_stats_nested(0)["allocated_bytes"]["all"]["peak"] > host_max  # the model's own
