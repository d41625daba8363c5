"""GPU figures in pods, on a real GPU with the real NVML and torch (skipped without CUDA): the
per-process figure or its reason, torch's stand-in, MIG devices, the torch-to-NVML mapping and the
mode that never resets torch's peak counters."""
from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest
import torch
from torch import nn

import memprof_otel as mp
from memprof_otel.sources import registry
from memprof_otel.sources.nvml import NvmlSource
from memprof_otel.sources.process_visibility import nvml_pid_blind_reason
from memprof_otel.telemetry.gpu_identity import identify, normalize_uuid
from memprof_otel.telemetry.series import SelfView, build_series
from memprof_otel.timeline import Sample

MIB = 1 << 20


@pytest.fixture
def on_gpu() -> Iterator[None]:
    torch.cuda.init()
    registry.reset_for_tests()
    yield
    registry.reset_for_tests()
    torch.cuda.empty_cache()


def test_per_process_figure_is_real_or_unknown_with_the_namespace_reason(on_gpu: None) -> None:
    import os

    t = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    told: list[str] = []
    src = NvmlSource(holds_cuda_memory=registry.holds_cuda_memory, on_process_unknown=told.append)
    try:
        readings = [src.readings() for _ in range(3)]  # the evidence rule needs two samples
    finally:
        src.close()
    blind = nvml_pid_blind_reason(os.getpid())
    mine = [g.process_used_bytes for g in readings[-1]]
    if blind is not None:  # a container without hostPID
        assert src.process_unknown == blind and told[0] == blind and mine == [None] * len(mine)
    elif src.process_unknown is None:
        # NVML sees us: its figure includes the CUDA context, so it is above torch's reserved bytes
        assert max(m or 0 for m in mine) >= torch.cuda.memory_reserved(0) >= t.numel()
    else:  # a sandbox the namespace check cannot see (gVisor, ...): the evidence rule caught it
        assert "none of its" in src.process_unknown and mine == [None] * len(mine)
    del t


def test_torch_uuid_matches_an_nvml_device_and_the_stand_in_is_torchs_reserved(on_gpu: None) -> None:
    t = torch.empty(64 * MIB, dtype=torch.uint8, device="cuda:0")
    uuids = registry.cuda_uuids()
    assert 0 in uuids and normalize_uuid(uuids[0]) == normalize_uuid(str(torch.cuda.get_device_properties(0).uuid))
    src = NvmlSource()
    try:
        gpus = src.readings()
    finally:
        src.close()
    ident = identify(uuids, gpus)[0]
    assert ident.matched, f"torch's UUID {uuids[0]} is none of NVML's {[g.uuid for g in gpus]}"
    assert ident.gpu_uuid.startswith("GPU-")
    reserved = torch.cuda.memory_reserved(0)
    sample = Sample(t=0.0, process={}, allocators={"cuda:0": {"reserved_bytes": reserved}}, gpus=gpus)
    series = build_series(sample, [], SelfView(cuda_uuids={0: uuids[0]}))
    rows = [v for lab, v in series["memprof_gpu_process_torch_reserved_bytes"] if lab["gpu_uuid"] == ident.gpu_uuid]
    assert rows == [float(reserved)]
    (info,) = [lab for lab, _ in series["memprof_cuda_device_info"] if lab["device"] == "cuda:0"]
    assert info["UUID"] == ident.gpu_uuid  # what dcgm-exporter's UUID label holds
    del t


def test_mig_devices_when_a_gpu_is_in_mig_mode(on_gpu: None) -> None:
    pynvml.nvmlInit()
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        modes = []
        for h in handles:
            try:
                modes.append(pynvml.nvmlDeviceGetMigMode(h)[0] == pynvml.NVML_DEVICE_MIG_ENABLE)
            except pynvml.NVMLError:
                modes.append(False)
    finally:
        pynvml.nvmlShutdown()
    src = NvmlSource()
    try:
        gpus = src.readings()
    finally:
        src.close()
    for g, mig_on in zip(gpus, modes):
        if not mig_on:
            assert g.migs == ()
    if not any(modes):
        pytest.skip("no GPU here is in MIG mode (the non-MIG case was checked above)")
    for g, mig_on in zip(gpus, modes):
        if mig_on:
            assert g.migs, "a GPU in MIG mode shows at least the MIG device this process runs on"
            for m in g.migs:
                assert m.uuid.startswith("MIG-") and 0 < m.total_bytes <= g.total_bytes
    # torch's device on a MIG slice maps to that slice
    ident = identify(registry.cuda_uuids(), gpus)[0]
    assert ident.mig_uuid or not any(modes)


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(1024, 4096)
        self.act = nn.GELU()
        self.down = nn.Linear(4096, 1024)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


def test_no_reset_mode_leaves_max_memory_allocated_to_the_host(on_gpu: None) -> None:
    # GIVEN the host's start-up profile: reset, a 512 MiB peak, max_memory_allocated() read
    model = _Mlp().cuda()
    x = torch.randn(64, 1024, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    profile = torch.empty(512 * MIB, dtype=torch.uint8, device="cuda")
    del profile
    host_max = torch.cuda.max_memory_allocated()
    # WHEN forwards run attributed in the no-reset mode
    with mp.instrument(model, name="no-reset", reset_peak_stats=False, every_n_forwards=1,
                       overhead_budget=1.0) as h:
        for _ in range(3):
            model(x)
        torch.cuda.synchronize()
        s = h.layer_stats()
    mp.shutdown(2)
    # THEN the host's figure is untouched
    assert torch.cuda.max_memory_allocated() == host_max
    # AND per-layer figures are the outputs' sizes: batch 64 x features x 4 bytes (fp32)
    assert s["up"].peak_increase == 64 * 4096 * 4 and s["up"].retained == 64 * 4096 * 4
    assert s["act"].retained == 64 * 4096 * 4
    assert s["down"].retained == 64 * 1024 * 4
    # the root keeps, besides its output, what autograd saved for backward (the forwards ran with
    # grad on): GELU's input (up's output) and down's input (act's output)
    assert s[""].retained == 64 * 1024 * 4 + 2 * 64 * 4096 * 4


def test_boundary_reads_do_disturb_max_memory_allocated(on_gpu: None) -> None:
    """Why ``reset_peak_stats: false`` exists for the per-boundary method: its resets replace the
    host's profile peak (the allocator trace, the default, never resets it)."""
    model = _Mlp().cuda()
    x = torch.randn(64, 1024, device="cuda")
    torch.cuda.reset_peak_memory_stats()
    profile = torch.empty(512 * MIB, dtype=torch.uint8, device="cuda")
    del profile
    host_max = torch.cuda.max_memory_allocated()
    with mp.instrument(model, name="resets", every_n_forwards=1, overhead_budget=1.0,
                       cuda={"attribution": "boundary_reads"}):
        model(x)
    mp.shutdown(2)
    assert torch.cuda.max_memory_allocated() < host_max
