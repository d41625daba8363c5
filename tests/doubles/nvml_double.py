"""ScriptedNvmlDouble: a test double standing in for the ``pynvml`` module, not a GPU.

This machine has no GPU and no NVIDIA driver, so unit tests drive ``NvmlSource`` through this
double. It offers the slice of the pynvml API the source uses, with pynvml's call shapes and return
types (the real ``c_nvmlMemory_t``/``c_nvmlMemory_v2_t`` structs, process entries built with the
real ``nvmlStructToFriendlyObject``), and raises the real ``pynvml.NVMLError`` subclasses, so the
source's error handling is tested against the exception types it meets in production.

Modelled: init/shutdown reference counting (calls without init raise ``Uninitialized``);
``simulate_fork()``, after which the old handles are stale and every call fails until ``nvmlInit``
runs again; v2 memory info whose ``used`` excludes driver-reserved memory (v1 counts it); bindings
without ``nvmlMemory_v2``, drivers without the v2 memory call or the v3 process calls (pynvml then
raises ``NVMLLibraryMismatchError``); ``usedGpuMemory`` "not available" both as pynvml >= 11.5
reports it (None) and as older bindings did (the raw sentinel); per-device injected failures.
Not modelled: MIG instances, events, anything NvmlSource does not call.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import pynvml

GIB = 1 << 30
NOT_AVAILABLE = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
_NO_INSTANCE = pynvml.NVML_VALUE_NOT_AVAILABLE_uint.value  # gpu/compute instance id without MIG


@dataclass
class ScriptedGpu:
    """One scripted device. ``used_script`` is the v2 ``used`` per memory query (the last value
    repeats); v1 reports ``used + reserved_bytes``. Processes are ``(pid, bytes or None)``.
    ``fail`` is an NVML error code every call on this device raises (set it any time);
    ``process_query_error`` one the process-list calls raise (e.g. NVML_ERROR_NOT_SUPPORTED)."""
    uuid: str
    name: str = "NVIDIA A100-SXM4-40GB"
    total_bytes: int = 40 * GIB
    used_script: Sequence[int] = (0,)
    reserved_bytes: int = 0
    compute_processes: list[tuple[int, int | None]] = field(default_factory=list)
    graphics_processes: list[tuple[int, int | None]] = field(default_factory=list)
    fail: int | None = None
    process_query_error: int | None = None
    memory_queries: int = 0

    def used_now(self) -> int:
        script = list(self.used_script)
        value = script[min(self.memory_queries, len(script) - 1)]
        self.memory_queries += 1
        return value


@dataclass(frozen=True)
class _Handle:
    index: int
    generation: int


class ScriptedNvmlDouble:
    """A test double, not the NVML library: a module-like object to pass as ``NvmlSource(nvml=)``.

    ``init_error`` makes ``nvmlInit`` raise that NVML error code. ``binding_has_memory_v2=False``
    plays a pynvml without ``nvmlMemory_v2`` (no ``version`` parameter either);
    ``driver_has_memory_v2=False`` a driver without ``nvmlDeviceGetMemoryInfo_v2``;
    ``driver_has_process_v3=False`` a driver older than the v3 process-list calls;
    ``binding_converts_not_available=False`` a binding that passes the raw "not available" value.
    ``calls`` counts every API call by name.
    """

    # the real exception types and codes, as ``pynvml.X``
    NVMLError = pynvml.NVMLError
    NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError

    def __init__(self, gpus: Sequence[ScriptedGpu] = (), *, driver_version: str = "550.54.15",
                 init_error: int | None = None, binding_has_memory_v2: bool = True,
                 driver_has_memory_v2: bool = True, driver_has_process_v3: bool = True,
                 binding_converts_not_available: bool = True) -> None:
        self.gpus = list(gpus)
        self.driver_version = driver_version
        self.init_error = init_error
        self.binding_has_memory_v2 = binding_has_memory_v2
        self.driver_has_memory_v2 = driver_has_memory_v2
        self.driver_has_process_v3 = driver_has_process_v3
        self.binding_converts_not_available = binding_converts_not_available
        self.calls: Counter[str] = Counter()
        self.refcount = 0
        self.generation = 0
        if binding_has_memory_v2:
            self.nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def __getattr__(self, name: str) -> Any:
        # NVML_ERROR_* codes and NVMLError_* classes, straight from the real module.
        if name.startswith(("NVML_ERROR_", "NVMLError_")):
            return getattr(pynvml, name)
        raise AttributeError(name)

    # -- scripting ------------------------------------------------------------------------------
    def simulate_fork(self) -> None:
        """What the child of a fork sees: NVML not initialised for it, every old handle stale."""
        self.generation += 1
        self.refcount = 0

    # -- the pynvml API ----------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.refcount += 1

    def nvmlShutdown(self) -> None:
        self.calls["nvmlShutdown"] += 1
        self._check_init()
        self.refcount -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self.calls["nvmlSystemGetDriverVersion"] += 1
        self._check_init()
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self.calls["nvmlDeviceGetCount"] += 1
        self._check_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self.calls["nvmlDeviceGetHandleByIndex"] += 1
        self._check_init()
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._check_fail(self.gpus[index])
        return _Handle(index, self.generation)

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        self.calls["nvmlDeviceGetUUID"] += 1
        return self._gpu(handle).uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        self.calls["nvmlDeviceGetName"] += 1
        return self._gpu(handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> Any:
        if version is not None and not self.binding_has_memory_v2:
            raise TypeError("nvmlDeviceGetMemoryInfo() got an unexpected keyword "
                            "argument 'version'")
        self.calls["nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo"] += 1
        gpu = self._gpu(handle)
        if version and not self.driver_has_memory_v2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        used = gpu.used_now()
        if version:
            return pynvml.c_nvmlMemory_v2_t(
                version=version, total=gpu.total_bytes, reserved=gpu.reserved_bytes,
                free=gpu.total_bytes - gpu.reserved_bytes - used, used=used)
        v1_used = used + gpu.reserved_bytes
        return pynvml.c_nvmlMemory_t(total=gpu.total_bytes, free=gpu.total_bytes - v1_used,
                                     used=v1_used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[Any]:
        return self._processes("nvmlDeviceGetComputeRunningProcesses", handle, v3=True)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: _Handle) -> list[Any]:
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v2", handle, v3=False)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: _Handle) -> list[Any]:
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses", handle, v3=True)

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: _Handle) -> list[Any]:
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses_v2", handle, v3=False)

    # -- internals ---------------------------------------------------------------------------------
    def _check_init(self) -> None:
        if self.refcount <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    @staticmethod
    def _check_fail(gpu: ScriptedGpu) -> None:
        if gpu.fail is not None:
            raise pynvml.NVMLError(gpu.fail)

    def _gpu(self, handle: _Handle) -> ScriptedGpu:
        self._check_init()
        if not isinstance(handle, _Handle) or handle.generation != self.generation:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # stale after a fork
        gpu = self.gpus[handle.index]
        self._check_fail(gpu)
        return gpu

    def _processes(self, call: str, handle: _Handle, *, v3: bool) -> list[Any]:
        self.calls[call] += 1
        gpu = self._gpu(handle)
        if v3 and not self.driver_has_process_v3:
            # pynvml's throwOnVersionMismatch turns FunctionNotFound into this (not an NVMLError)
            raise pynvml.NVMLLibraryMismatchError(f"{call}: use a versioned function such as _v2")
        if gpu.process_query_error is not None:
            raise pynvml.NVMLError(gpu.process_query_error)
        entries = gpu.compute_processes if "Compute" in call else gpu.graphics_processes
        out = []
        for pid, used in entries:
            raw = NOT_AVAILABLE if used is None else used
            obj = pynvml.nvmlStructToFriendlyObject(pynvml.c_nvmlProcessInfo_v2_t(
                pid=pid, usedGpuMemory=raw, gpuInstanceId=_NO_INSTANCE,
                computeInstanceId=_NO_INSTANCE))
            if self.binding_converts_not_available and obj.usedGpuMemory == NOT_AVAILABLE:
                obj.usedGpuMemory = None
            out.append(obj)
        return out
