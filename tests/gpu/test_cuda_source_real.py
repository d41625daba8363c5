"""CudaAllocatorSource against a real GPU (cuda:0), with torch's own fns. Skipped without CUDA."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from memprof_otel.sources.cuda import CudaAllocatorSource, available_devices
from memprof_otel.sources.cuda_stats import FIGURE_KEYS, figures
from tests.doubles.cuda_allocator_double import MIB, ScriptedCudaAllocatorDouble


@pytest.fixture
def source() -> Iterator[CudaAllocatorSource]:
    torch.cuda.init()
    torch.cuda.synchronize()
    yield CudaAllocatorSource(0)
    torch.cuda.empty_cache()


def test_cuda_0_is_available() -> None:
    assert 0 in available_devices()


def test_allocating_a_tensor_raises_allocated_by_at_least_its_size(source: CudaAllocatorSource) -> None:
    before = source.reading()
    t = torch.empty(8 * MIB, dtype=torch.uint8, device="cuda:0")
    after = source.reading()
    assert after.allocated - before.allocated >= t.numel()
    assert after.reserved >= after.allocated
    assert after.allocations > before.allocations
    del t
    assert source.allocated() == before.allocated


def test_reset_drops_the_device_peak_but_not_the_lifetime_peak(source: CudaAllocatorSource) -> None:
    base = source.allocated()
    t = torch.empty(64 * MIB, dtype=torch.uint8, device="cuda:0")
    del t
    assert source.peak_since_reset() >= base + 64 * MIB
    source.reset_peak()
    assert source.peak_since_reset() < base + 64 * MIB
    assert source.stats()["allocated_peak_bytes"] >= base + 64 * MIB


def test_figures_on_real_stats_are_sane(source: CudaAllocatorSource) -> None:
    t = torch.empty(3 * MIB, dtype=torch.uint8, device="cuda:0")
    f = figures(torch._C._cuda_memoryStats(0))
    assert set(f) == set(FIGURE_KEYS)
    assert f["reserved_bytes"] >= f["allocated_bytes"] >= t.numel()
    assert 0.0 <= f["fragmentation_ratio"] <= 1.0 and 0.0 <= f["cache_free_ratio"] <= 1.0
    assert f["allocations"] >= 1
    del t


def test_real_layout_contains_every_key_the_double_emits() -> None:
    torch.cuda.init()
    real = torch._C._cuda_memoryStats(0)
    fake = ScriptedCudaAllocatorDouble().memory_stats_nested(0)
    # Keys newer than the installed torch (e.g. num_oom_rejections) may be missing in older builds.
    missing = set(fake) - set(real) - {"num_oom_rejections"}
    assert not missing
    for name in ("allocated_bytes", "allocation", "inactive_split_bytes"):
        assert set(real[name]) == set(fake[name])
        assert set(real[name]["all"]) == set(fake[name]["all"])


def test_a_capture_on_a_real_gpu_records_allocator_history_only_in_its_window() -> None:
    import memprof_otel as mp

    def traced() -> int:
        return sum(len(t) for t in torch.cuda.memory._snapshot().get("device_traces", []))

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).cuda()
    x = torch.randn(16, 64, device="cuda")
    with mp.instrument(model, name="gpu-history") as h:
        cap = h.capture(forwards=1)
        model(x)
        assert cap.wait(10)
        before = traced()
        model(x)  # after the window: nothing more is recorded
        assert traced() == before
    assert cap.cuda_snapshot is not None
    assert any(e["action"] == "alloc" for trace in cap.cuda_snapshot["device_traces"] for e in trace)
    mp.shutdown(2)
