"""NvmlSource driven by the scripted NVML double, and the real pynvml on this GPU-less host."""
from __future__ import annotations

import logging
import os
import sys

import pynvml
import pytest

from memprof_otel.errors import SourceUnavailable
from memprof_otel.sources import nvml as nvml_mod
from memprof_otel.sources import registry
from memprof_otel.sources.nvml import NvmlReadError, NvmlSource, NvmlUnavailable
from memprof_otel.timeline import GpuReading
from tests.doubles.nvml_double import GIB, NOT_AVAILABLE, ScriptedGpu, ScriptedNvmlDouble

ME = 4242
OTHER = 777
UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-66666666-7777-8888-9999-000000000000"


def two_gpus(**double_kw: object) -> ScriptedNvmlDouble:
    return ScriptedNvmlDouble([
        ScriptedGpu(UUID0, used_script=(5 * GIB, 6 * GIB), compute_processes=[(ME, 2 * GIB),
                                                                              (OTHER, 3 * GIB)]),
        ScriptedGpu(UUID1, name="NVIDIA L4", total_bytes=24 * GIB, used_script=(1 * GIB,),
                    compute_processes=[(OTHER, 1 * GIB)]),
    ], **double_kw)  # type: ignore[arg-type]


def only_gpu(**gpu_kw: object) -> ScriptedNvmlDouble:
    return ScriptedNvmlDouble([ScriptedGpu(UUID0, **gpu_kw)])  # type: ignore[arg-type]


# -- readings ---------------------------------------------------------------------------------

def test_readings_report_every_device_with_static_info_and_this_process_share() -> None:
    src = NvmlSource(nvml=two_gpus(), pid=ME)
    assert src.name == "nvml"
    assert src.readings() == (
        GpuReading(index=0, uuid=UUID0, model="NVIDIA A100-SXM4-40GB", driver_version="550.54.15",
                   used_bytes=5 * GIB, total_bytes=40 * GIB, process_used_bytes=2 * GIB),
        GpuReading(index=1, uuid=UUID1, model="NVIDIA L4", driver_version="550.54.15",
                   used_bytes=1 * GIB, total_bytes=24 * GIB, process_used_bytes=0),
    )
    assert [r.used_bytes for r in src.readings()] == [6 * GIB, 1 * GIB]  # the script advances
    assert (src.errors, src.last_errors) == (0, [])


def test_zero_devices_is_an_empty_tuple_not_an_error() -> None:
    src = NvmlSource(nvml=ScriptedNvmlDouble([]))
    assert src.readings() == ()
    assert src.device_info() == []


def test_static_info_is_read_once_across_ticks() -> None:
    double = two_gpus()
    src = NvmlSource(nvml=double, pid=ME)
    for _ in range(5):
        src.readings()
    src.device_info()
    for call in ("nvmlSystemGetDriverVersion", "nvmlDeviceGetCount"):
        assert double.calls[call] == 1, call
    for call in ("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID", "nvmlDeviceGetName"):
        assert double.calls[call] == 2, call  # once per device
    assert double.calls["nvmlDeviceGetMemoryInfo_v2"] == 12


def test_string_getters_returning_bytes_are_decoded() -> None:
    # pynvml before 11.5 returned bytes from the string getters
    gpu = ScriptedGpu(UUID0.encode(), name=b"Tesla T4")  # type: ignore[arg-type]
    double = ScriptedNvmlDouble([gpu])
    double.driver_version = b"470.239.06"  # type: ignore[assignment]
    (r,) = NvmlSource(nvml=double).readings()
    assert (r.uuid, r.model, r.driver_version) == (UUID0, "Tesla T4", "470.239.06")


# -- memory info v2 / v1 ----------------------------------------------------------------------

def test_v2_memory_info_excludes_reserved_memory_from_used() -> None:
    double = only_gpu(used_script=(3 * GIB,), reserved_bytes=GIB // 2)
    (r,) = NvmlSource(nvml=double).readings()
    assert r.used_bytes == 3 * GIB
    assert double.calls["nvmlDeviceGetMemoryInfo"] == 0


def test_driver_without_v2_memory_info_falls_back_to_v1_once() -> None:
    gpu = ScriptedGpu(UUID0, used_script=(3 * GIB,), reserved_bytes=GIB // 2)
    double = ScriptedNvmlDouble([gpu], driver_has_memory_v2=False)
    src = NvmlSource(nvml=double)
    for _ in range(3):
        (r,) = src.readings()
        assert r.used_bytes == 3 * GIB + GIB // 2  # v1's used includes the reserved part
    assert double.calls["nvmlDeviceGetMemoryInfo_v2"] == 1  # not retried every tick
    assert double.calls["nvmlDeviceGetMemoryInfo"] == 3
    assert src.errors == 0


def test_binding_without_nvmlMemory_v2_uses_v1() -> None:
    double = ScriptedNvmlDouble([ScriptedGpu(UUID0, used_script=(GIB,), reserved_bytes=GIB)],
                                binding_has_memory_v2=False)
    (r,) = NvmlSource(nvml=double).readings()
    assert r.used_bytes == 2 * GIB
    assert double.calls["nvmlDeviceGetMemoryInfo_v2"] == 0


# -- this process's share -----------------------------------------------------------------------

def test_process_share_defaults_to_this_pid() -> None:
    double = only_gpu(compute_processes=[(os.getpid(), 123 * 1024 * 1024), (OTHER, GIB)])
    (r,) = NvmlSource(nvml=double).readings()
    assert r.process_used_bytes == 123 * 1024 * 1024


def test_process_not_listed_is_zero() -> None:
    (r,) = NvmlSource(nvml=only_gpu(compute_processes=[(OTHER, GIB)]), pid=ME).readings()
    assert r.process_used_bytes == 0


def test_process_query_not_supported_is_none_and_not_an_error() -> None:
    double = only_gpu(used_script=(GIB,), process_query_error=pynvml.NVML_ERROR_NOT_SUPPORTED)
    src = NvmlSource(nvml=double, pid=ME)
    (r,) = src.readings()
    assert (r.used_bytes, r.process_used_bytes) == (GIB, None)
    assert src.errors == 0


@pytest.mark.parametrize("converts", [True, False], ids=["pynvml-None", "raw-sentinel"])
def test_process_memory_not_available_is_none(converts: bool) -> None:
    double = ScriptedNvmlDouble([ScriptedGpu(UUID0, compute_processes=[(ME, None)])],
                                binding_converts_not_available=converts)
    src = NvmlSource(nvml=double, pid=ME)
    (proc,) = double.nvmlDeviceGetComputeRunningProcesses(double.nvmlDeviceGetHandleByIndex(0))
    assert proc.usedGpuMemory == (None if converts else NOT_AVAILABLE)  # what reaches the source
    (r,) = src.readings()
    assert r.process_used_bytes is None


def test_process_with_compute_and_graphics_contexts_is_counted_once() -> None:
    double = only_gpu(compute_processes=[(ME, 2 * GIB)], graphics_processes=[(ME, 2 * GIB)])
    (r,) = NvmlSource(nvml=double, pid=ME).readings()
    assert r.process_used_bytes == 2 * GIB


def test_graphics_only_process_is_found() -> None:
    (r,) = NvmlSource(nvml=only_gpu(graphics_processes=[(ME, GIB)]), pid=ME).readings()
    assert r.process_used_bytes == GIB


def test_driver_without_v3_process_calls_uses_v2() -> None:
    double = ScriptedNvmlDouble([ScriptedGpu(UUID0, compute_processes=[(ME, GIB)])],
                                driver_has_process_v3=False)
    src = NvmlSource(nvml=double, pid=ME)
    for _ in range(3):
        (r,) = src.readings()
        assert r.process_used_bytes == GIB
    assert double.calls["nvmlDeviceGetComputeRunningProcesses"] == 1  # the working call is kept
    assert double.calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 3
    assert src.errors == 0


def test_process_query_failure_keeps_the_device_figures_and_is_recorded() -> None:
    double = only_gpu(used_script=(GIB,), compute_processes=[(ME, GIB)],
                      process_query_error=pynvml.NVML_ERROR_NO_PERMISSION)
    src = NvmlSource(nvml=double, pid=ME)
    (r,) = src.readings()
    assert (r.used_bytes, r.process_used_bytes) == (GIB, None)
    assert src.errors == 1
    assert src.last_errors == ["gpu 0 processes: NVMLError_NoPermission: Insufficient Permissions"]


# -- failures ------------------------------------------------------------------------------------

def test_one_failing_device_does_not_lose_the_others_and_recovers() -> None:
    double = two_gpus()
    src = NvmlSource(nvml=double, pid=ME)
    src.readings()
    handles_before = double.calls["nvmlDeviceGetHandleByIndex"]

    double.gpus[0].fail = pynvml.NVML_ERROR_GPU_IS_LOST
    (r,) = src.readings()
    assert r.index == 1
    assert src.last_errors == ["gpu 0: NVMLError_GpuIsLost: GPU is lost"]
    assert src.errors == 1

    double.gpus[0].fail = None
    assert [r.index for r in src.readings()] == [0, 1]
    assert src.last_errors == []
    assert src.errors == 1  # cumulative
    # the failed device's handle was dropped and fetched again
    assert double.calls["nvmlDeviceGetHandleByIndex"] == handles_before + 1


def test_all_devices_failing_raises_for_the_sampler_to_count() -> None:
    double = two_gpus()
    src = NvmlSource(nvml=double, pid=ME)
    for gpu in double.gpus:
        gpu.fail = pynvml.NVML_ERROR_UNKNOWN
    with pytest.raises(NvmlReadError, match=r"all 2 device\(s\) failed") as info:
        src.readings()
    assert isinstance(info.value.__cause__, pynvml.NVMLError_Unknown)
    assert src.errors == 2 and len(src.last_errors) == 2
    for gpu in double.gpus:
        gpu.fail = None
    assert len(src.readings()) == 2  # and the next tick works again


def test_device_info_lists_static_facts_and_failing_devices() -> None:
    double = two_gpus()
    double.gpus[1].fail = pynvml.NVML_ERROR_GPU_IS_LOST
    src = NvmlSource(nvml=double)
    assert src.device_info() == [
        {"index": 0, "uuid": UUID0, "model": "NVIDIA A100-SXM4-40GB", "driver_version": "550.54.15",
         "total_bytes": 40 * GIB},
        {"index": 1, "error": "NVMLError_GpuIsLost: GPU is lost"},
    ]
    assert src.last_errors == ["gpu 1: NVMLError_GpuIsLost: GPU is lost"]


@pytest.mark.parametrize("code, text, no_gpu", [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found", True),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded", True),
    (pynvml.NVML_ERROR_NO_PERMISSION, "Insufficient Permissions", False),
])
def test_init_failure_is_source_unavailable_with_a_readable_reason(code: int, text: str,
                                                                   no_gpu: bool) -> None:
    with pytest.raises(SourceUnavailable) as info:
        NvmlSource(nvml=ScriptedNvmlDouble([], init_error=code))
    assert str(info.value) == f"NVML unavailable: {text}"
    assert isinstance(info.value, NvmlUnavailable) and info.value.no_gpu is no_gpu


def test_failure_right_after_init_shuts_nvml_down_again() -> None:
    double = two_gpus()

    def broken() -> str:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    double.nvmlSystemGetDriverVersion = broken  # type: ignore[method-assign]
    with pytest.raises(NvmlUnavailable, match="Unknown Error"):
        NvmlSource(nvml=double)
    assert double.refcount == 0 and double.calls["nvmlShutdown"] == 1


def test_missing_pynvml_is_source_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with pytest.raises(NvmlUnavailable, match="pynvml is not importable") as info:
        NvmlSource()
    assert info.value.no_gpu


# -- fork ----------------------------------------------------------------------------------------

def test_pid_change_reinitialises_nvml_and_fetches_new_handles(
        monkeypatch: pytest.MonkeyPatch) -> None:
    double = two_gpus()
    src = NvmlSource(nvml=double, pid=ME)
    src.readings()

    double.simulate_fork()
    monkeypatch.setattr(nvml_mod, "_getpid", lambda: 99999)
    assert len(src.readings()) == 2
    assert double.calls["nvmlInit"] == 2
    assert double.calls["nvmlDeviceGetHandleByIndex"] == 4
    assert src.errors == 0
    src.readings()
    assert double.calls["nvmlInit"] == 2  # once per fork, not per tick


def test_without_reinit_stale_handles_fail() -> None:
    # the double's fork model is what makes the test above meaningful
    double = two_gpus()
    double.nvmlInit()
    handle = double.nvmlDeviceGetHandleByIndex(0)
    double.simulate_fork()
    double.nvmlInit()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        double.nvmlDeviceGetMemoryInfo(handle)


def test_process_share_follows_the_child_pid_after_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    double = only_gpu(compute_processes=[(ME, GIB), (ME + 1, 2 * GIB)])
    monkeypatch.setattr(nvml_mod, "_getpid", lambda: ME)
    src = NvmlSource(nvml=double)
    assert src.readings()[0].process_used_bytes == GIB
    double.simulate_fork()
    monkeypatch.setattr(nvml_mod, "_getpid", lambda: ME + 1)
    assert src.readings()[0].process_used_bytes == 2 * GIB


def test_failed_reinit_after_fork_raises_and_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    double = two_gpus()
    src = NvmlSource(nvml=double, pid=ME)
    double.simulate_fork()
    double.init_error = pynvml.NVML_ERROR_UNKNOWN
    monkeypatch.setattr(nvml_mod, "_getpid", lambda: 99999)
    with pytest.raises(NvmlReadError, match="re-initialisation after fork failed"):
        src.readings()
    double.init_error = None
    assert len(src.readings()) == 2


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_real_fork_reinitialises_in_the_child() -> None:
    double = two_gpus()
    src = NvmlSource(nvml=double, pid=ME)
    src.readings()
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            double.simulate_fork()
            ok = len(src.readings()) == 2 and double.calls["nvmlInit"] == 2
            os.write(write_fd, b"ok" if ok else b"bad")
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        answer = pipe.read()
    os.waitpid(child, 0)
    assert answer == b"ok"
    assert double.calls["nvmlInit"] == 1  # the parent did not re-initialise
    assert len(src.readings()) == 2


# -- close ----------------------------------------------------------------------------------------

def test_close_shuts_down_once_and_is_idempotent() -> None:
    double = two_gpus()
    src = NvmlSource(nvml=double)
    src.close()
    src.close()
    assert double.calls["nvmlShutdown"] == 1 and double.refcount == 0
    with pytest.raises(SourceUnavailable, match="closed"):
        src.readings()


def test_close_in_a_child_that_never_reinitialised_leaves_the_parent_init(
        monkeypatch: pytest.MonkeyPatch) -> None:
    double = two_gpus()
    src = NvmlSource(nvml=double)
    monkeypatch.setattr(nvml_mod, "_getpid", lambda: 99999)
    src.close()
    assert double.calls["nvmlShutdown"] == 0


def test_close_never_raises() -> None:
    double = two_gpus()
    src = NvmlSource(nvml=double)
    double.refcount = 0  # someone else shut NVML down: nvmlShutdown raises Uninitialized
    src.close()
    assert double.calls["nvmlShutdown"] == 1


# -- the real pynvml on this host (no GPU, no driver) -------------------------------------------

def _real_nvml_works() -> bool:
    try:
        NvmlSource().close()
    except SourceUnavailable:
        return False
    return True


needs_no_nvml = pytest.mark.skipif(_real_nvml_works(), reason="NVML works on this host")


@needs_no_nvml
def test_real_pynvml_without_a_driver_is_source_unavailable() -> None:
    with pytest.raises(SourceUnavailable) as info:
        NvmlSource()
    reason = str(info.value)
    assert reason.startswith("NVML unavailable: ")
    assert "Not Found" in reason or "Not Loaded" in reason, reason
    assert "\n" not in reason and len(reason) < 120


@needs_no_nvml
def test_registry_nvml_is_none_with_the_reason_and_logs_one_line(
        caplog: pytest.LogCaptureFixture) -> None:
    registry.reset_for_tests()
    try:
        with caplog.at_level(logging.INFO, logger="memprof_otel"):
            assert registry.nvml() is None
            assert registry.nvml() is None
        assert registry.down_reasons()["nvml"].startswith("NVML unavailable: ")
        lines = [r for r in caplog.records if "NVML" in r.getMessage()]
        assert len(lines) == 1
        assert lines[0].name == "memprof_otel" and lines[0].levelno == logging.INFO
        assert lines[0].getMessage().endswith("; GPU device metrics off")
        assert "\n" not in lines[0].getMessage()
    finally:
        registry.reset_for_tests()


def test_registry_warns_when_nvml_is_present_but_broken(monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    def broken(**_: object) -> NvmlSource:
        raise NvmlUnavailable("Insufficient Permissions", no_gpu=False)

    monkeypatch.setattr(registry, "NvmlSource", broken)  # what the registry builds from
    registry.reset_for_tests()
    try:
        with caplog.at_level(logging.INFO, logger="memprof_otel"):
            assert registry.nvml() is None
        (line,) = [r for r in caplog.records if "NVML" in r.getMessage()]
        assert line.levelno == logging.WARNING
        assert line.getMessage() == ("memprof_otel: NVML unavailable (Insufficient Permissions); "
                                     "GPU device metrics off")
    finally:
        registry.reset_for_tests()

