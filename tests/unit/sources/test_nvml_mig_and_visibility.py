"""NvmlSource's per-process figure where NVML cannot see our PID, and MIG devices, driven by the
scripted NVML double (``tests/doubles/nvml_double.py``: a test double, not a GPU)."""
from __future__ import annotations

import logging

import pynvml
import pytest

from memprof_otel.sources import nvml as nvml_mod
from memprof_otel.sources import registry
from memprof_otel.sources.nvml import NvmlSource
from memprof_otel.sources.process_visibility import HOST_PID_NAMESPACE, nvml_pid_blind_reason
from memprof_otel.timeline import MigReading
from tests.doubles.nvml_double import GIB, ScriptedGpu, ScriptedMig, ScriptedNvmlDouble

ME = 4242
OTHER = 777
UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-66666666-7777-8888-9999-000000000000"
MIG_A = "MIG-aaaaaaaa-0000-5000-8000-000000000001"
MIG_B = "MIG-bbbbbbbb-0000-5000-8000-000000000002"
MIG_HIDDEN = "MIG-cccccccc-0000-5000-8000-000000000003"
NS_REASON = "this process runs in its own PID namespace (pid:[4026532999])"


def two_gpus() -> ScriptedNvmlDouble:
    return ScriptedNvmlDouble([
        ScriptedGpu(UUID0, used_script=(5 * GIB,), compute_processes=[(ME, 2 * GIB), (OTHER, 3 * GIB)]),
        ScriptedGpu(UUID1, used_script=(1 * GIB,), compute_processes=[(OTHER, 1 * GIB)]),
    ])


def host_pids_only() -> ScriptedNvmlDouble:
    """What NVML shows inside a container: host PIDs, none of them ours."""
    return ScriptedNvmlDouble([
        ScriptedGpu(UUID0, used_script=(5 * GIB,), compute_processes=[(91234, 2 * GIB), (OTHER, 3 * GIB)]),
        ScriptedGpu(UUID1, used_script=(1 * GIB,), compute_processes=[(OTHER, 1 * GIB)]),
    ])


# -- the PID namespace check -------------------------------------------------------------------

def test_host_pid_namespace_is_the_kernels_fixed_init_inode() -> None:
    assert HOST_PID_NAMESPACE == "pid:[4026531836]"  # PROC_PID_INIT_INO = 0xEFFFFFFC
    assert nvml_pid_blind_reason(12, readlink=lambda p: "pid:[4026531836]") is None


def test_a_container_pid_namespace_is_named_in_the_reason() -> None:
    reason = nvml_pid_blind_reason(12, readlink=lambda p: "pid:[4026532999]")
    assert reason is not None and "pid:[4026532999]" in reason and "PID 12" in reason


def test_an_unreadable_namespace_trusts_the_pid() -> None:
    def unreadable(path: str) -> str:
        raise PermissionError(path)
    assert nvml_pid_blind_reason(12, readlink=unreadable) is None


# -- per-process figure: unknown, not 0, where NVML cannot see us ------------------------------

def test_in_a_pid_namespace_the_figure_is_unknown_even_when_a_listed_pid_equals_ours(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN our container PID happens to equal a host PID that NVML lists (2 GiB on GPU 0)
    monkeypatch.setattr(nvml_mod, "_getpid", lambda: ME)
    told: list[str] = []
    src = NvmlSource(nvml=two_gpus(), pid_namespace=lambda pid: NS_REASON, on_process_unknown=told.append)
    # WHEN it is read three times
    readings = [src.readings() for _ in range(3)]
    # THEN the per-process figure is unknown on every GPU, the device figures are intact,
    # and the reason was told once
    for r in readings:
        assert [g.process_used_bytes for g in r] == [None, None]
        assert [g.used_bytes for g in r] == [5 * GIB, 1 * GIB]
    assert told == [NS_REASON] and src.process_unknown == NS_REASON


def test_torch_memory_that_no_gpu_lists_makes_the_figure_unknown_after_two_samples() -> None:
    told: list[str] = []
    holds = [True]
    src = NvmlSource(nvml=host_pids_only(), pid=ME, holds_cuda_memory=lambda: holds[0],
                     on_process_unknown=told.append)
    # one sample could be a context created between the two reads: still 0 (the lists' word)
    assert [g.process_used_bytes for g in src.readings()] == [0, 0]
    assert told == []
    # the second in a row is conclusive
    assert [g.process_used_bytes for g in src.readings()] == [None, None]
    (reason,) = told
    assert f"PID {ME}" in reason and "none of its 2 GPU(s)" in reason
    # and it stays unknown: NVML will not learn our PID later
    holds[0] = False
    assert [g.process_used_bytes for g in src.readings()] == [None, None]
    assert told == [reason]


def test_one_sample_without_a_listing_in_between_resets_the_evidence() -> None:
    holds = iter([True, False, True, False])
    src = NvmlSource(nvml=host_pids_only(), pid=ME, holds_cuda_memory=lambda: next(holds))
    for _ in range(4):
        assert [g.process_used_bytes for g in src.readings()] == [0, 0]
    assert src.process_unknown is None


def test_without_torch_memory_an_unlisted_process_really_uses_zero() -> None:
    src = NvmlSource(nvml=host_pids_only(), pid=ME, holds_cuda_memory=lambda: False)
    for _ in range(3):
        assert [g.process_used_bytes for g in src.readings()] == [0, 0]
    assert src.process_unknown is None


def test_listed_on_one_gpu_is_seen_and_counted_exactly() -> None:
    src = NvmlSource(nvml=two_gpus(), pid=ME, holds_cuda_memory=lambda: True)
    for _ in range(3):
        assert [g.process_used_bytes for g in src.readings()] == [2 * GIB, 0]
    assert src.process_unknown is None


def test_a_gpu_that_cannot_list_processes_is_told_and_unknown_alone() -> None:
    double = two_gpus()
    double.gpus[1].process_query_error = pynvml.NVML_ERROR_NOT_SUPPORTED
    told: list[str] = []
    src = NvmlSource(nvml=double, pid=ME, on_process_unknown=told.append)
    for _ in range(2):
        assert [g.process_used_bytes for g in src.readings()] == [2 * GIB, None]
    assert told == ["gpu 1: NVML cannot list this GPU's processes here (not supported)"]


def test_registry_marks_nvml_process_down_with_the_reason_and_logs_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # GIVEN the registry builds its NVML source over the double, in a container's PID namespace
    def make(**kw: object) -> NvmlSource:
        return NvmlSource(nvml=two_gpus(), pid_namespace=lambda pid: NS_REASON, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(registry, "NvmlSource", make)
    monkeypatch.setattr("memprof_otel._log._warned", set())
    registry.reset_for_tests()
    try:
        with caplog.at_level(logging.INFO, logger="memprof_otel"):
            src = registry.nvml()
            assert src is not None
            src.readings()
            src.readings()
        # THEN the source is down with the reason (what /v1/status and memprof_source_up read)
        assert registry.down_reasons() == {"nvml_process": NS_REASON}
        (line,) = [r for r in caplog.records if "nvml" in r.getMessage().lower()]
        assert line.levelno == logging.WARNING and NS_REASON in line.getMessage()
        assert "memprof_gpu_process_torch_reserved_bytes" in line.getMessage()
    finally:
        registry.reset_for_tests()


# -- MIG --------------------------------------------------------------------------------------

def mig_gpu(**kw: object) -> ScriptedGpu:
    """An A100 40 GB in MIG mode: a 3g.20gb instance (slot 0), a 1g.5gb another container owns
    (slot 1, hidden from us), and a 2g.10gb instance (slot 3) where this process runs."""
    return ScriptedGpu(UUID0, used_script=(18 * GIB,), mig_mode=True, migs=[
        ScriptedMig(MIG_A, slot=0, gpu_instance_id=1, total_bytes=20 * GIB, used_bytes=12 * GIB,
                    compute_processes=[(OTHER, 12 * GIB)]),
        ScriptedMig(MIG_HIDDEN, slot=1, gpu_instance_id=13, total_bytes=5 * GIB, used_bytes=2 * GIB,
                    visible=False),
        ScriptedMig(MIG_B, slot=3, gpu_instance_id=5, compute_instance_id=0, total_bytes=10 * GIB,
                    used_bytes=4 * GIB, compute_processes=[(ME, 3 * GIB)]),
    ], **kw)  # type: ignore[arg-type]


def test_mig_devices_are_enumerated_with_their_identity_and_memory() -> None:
    src = NvmlSource(nvml=ScriptedNvmlDouble([mig_gpu()]), pid=ME)
    (g,) = src.readings()
    assert (g.uuid, g.used_bytes, g.total_bytes) == (UUID0, 18 * GIB, 40 * GIB)
    assert g.migs == (MigReading(MIG_A, 1, 0, 12 * GIB, 20 * GIB), MigReading(MIG_B, 5, 0, 4 * GIB, 10 * GIB))
    assert src.last_errors == []


def test_in_mig_mode_our_share_comes_from_the_mig_devices_without_privileges() -> None:
    # the parent's aggregate process list answers NO_PERMISSION to an unprivileged caller
    double = ScriptedNvmlDouble([mig_gpu(privileged=False)])
    (g,) = NvmlSource(nvml=double, pid=ME).readings()
    assert g.process_used_bytes == 3 * GIB
    assert double.calls["nvmlDeviceGetComputeRunningProcesses"] == 2  # one per visible MIG device


def test_a_gpu_without_mig_is_asked_about_mig_once() -> None:
    double = two_gpus()
    src = NvmlSource(nvml=double, pid=ME)
    for _ in range(4):
        assert all(g.migs == () for g in src.readings())
    assert double.calls["nvmlDeviceGetMigMode"] == 2  # once per GPU, then remembered
    assert double.calls["nvmlDeviceGetMaxMigDeviceCount"] == 0


def test_mig_capable_gpu_with_mig_off_has_no_mig_devices_and_parent_process_lists() -> None:
    gpu = mig_gpu()
    gpu.mig_mode = False
    gpu.compute_processes = [(ME, 1 * GIB)]
    (g,) = NvmlSource(nvml=ScriptedNvmlDouble([gpu]), pid=ME).readings()
    assert g.migs == () and g.process_used_bytes == 1 * GIB


def test_a_failing_mig_query_keeps_the_gpu_figures() -> None:
    double = ScriptedNvmlDouble([mig_gpu()])

    def broken(handle: object) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
    double.nvmlDeviceGetMaxMigDeviceCount = broken  # type: ignore[method-assign]
    src = NvmlSource(nvml=double, pid=ME)
    (g,) = src.readings()
    assert g.used_bytes == 18 * GIB and g.migs == ()
    # without its MIG devices the share falls back to the parent's list, which an unprivileged
    # caller may not read in MIG mode: unknown, said in the errors, never a made-up 0
    assert g.process_used_bytes is None
    assert src.last_errors[0].startswith("gpu 0 MIG: NVMLError_Unknown")
    assert src.last_errors[1].startswith("gpu 0 processes: NVMLError_NoPermission")


def test_device_info_lists_the_mig_devices() -> None:
    (info,) = NvmlSource(nvml=ScriptedNvmlDouble([mig_gpu()])).device_info()
    assert info["mig_devices"] == [
        {"uuid": MIG_A, "gpu_instance_id": 1, "compute_instance_id": 0, "total_bytes": 20 * GIB},
        {"uuid": MIG_B, "gpu_instance_id": 5, "compute_instance_id": 0, "total_bytes": 10 * GIB}]


def test_mig_readings_round_trip_through_the_timeline_format() -> None:
    from memprof_otel.timeline import Sample

    (g,) = NvmlSource(nvml=ScriptedNvmlDouble([mig_gpu()]), pid=ME).readings()
    s = Sample(t=1.0, process={}, gpus=(g,))
    assert Sample.from_dict(s.to_dict()) == s


def test_info_command_lists_mig_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    from memprof_otel.cli import info

    monkeypatch.setattr(info, "NvmlSource", lambda: NvmlSource(nvml=ScriptedNvmlDouble([mig_gpu()])))
    text = info.format_text(info.collect())
    assert f"      MIG {MIG_A} (GPU instance 1), 20.0 GiB" in text
    assert f"      MIG {MIG_B} (GPU instance 5), 10.0 GiB" in text
    assert MIG_HIDDEN not in text


def test_holds_cuda_memory_is_torchs_reserved_bytes_on_any_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from memprof_otel.sources.cuda import CudaAllocatorSource
    from tests.doubles.cuda_allocator_double import MIB, ScriptedCudaAllocatorDouble

    devs = {i: ScriptedCudaAllocatorDouble(i) for i in (0, 1)}
    srcs = {i: CudaAllocatorSource(i, stats_fn=d.memory_stats_nested, reset_peak_fn=d.reset_peak)
            for i, d in devs.items()}
    monkeypatch.setattr(registry, "available_devices", lambda: [0, 1])
    monkeypatch.setattr(registry, "cuda_allocator", lambda i: srcs[i])
    assert registry.holds_cuda_memory() is False  # no segment yet: no evidence of a context
    h = devs[1].malloc(1 * MIB)
    devs[1].free(h)  # freed, but the segment stays cached: the context is certainly there
    assert registry.holds_cuda_memory() is True

    def broken(index: int) -> dict:
        raise RuntimeError("driver went away")
    srcs[0]._stats_fn = broken  # type: ignore[assignment]
    assert registry.holds_cuda_memory() is True  # device 0 failing hides nothing of device 1
    srcs[1]._stats_fn = broken  # type: ignore[assignment]
    assert registry.holds_cuda_memory() is False  # failing reads are no evidence, never an error
