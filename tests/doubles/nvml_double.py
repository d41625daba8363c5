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
MIG: GPUs without MIG support (``nvmlDeviceGetMigMode`` answers NOT_SUPPORTED), MIG mode on or
off, MIG devices in slots up to ``nvmlDeviceGetMaxMigDeviceCount`` (empty slots and slots owned
by another container answer NOT_FOUND), their own handles, UUIDs, GPU/compute instance ids, memory
and process lists (entries carry the instance ids), and the parent's aggregate process list that
needs privileges in MIG mode (NO_PERMISSION otherwise), as nvml.h documents it.
Not modelled: events, MIG reconfiguration calls, anything NvmlSource does not call.
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
class ScriptedMig:
    """One MIG device (GPU instance + compute instance) in ``slot`` of its parent GPU.
    ``visible=False`` plays a slot another container owns (NVML answers NOT_FOUND)."""
    uuid: str
    slot: int
    gpu_instance_id: int
    compute_instance_id: int = 0
    total_bytes: int = 10 * GIB
    used_bytes: int = 0
    compute_processes: list[tuple[int, int | None]] = field(default_factory=list)
    visible: bool = True


@dataclass
class ScriptedGpu:
    """One scripted device. ``used_script`` is the v2 ``used`` per memory query (the last value
    repeats); v1 reports ``used + reserved_bytes``. Processes are ``(pid, bytes or None)``.
    ``fail`` is an NVML error code every call on this device raises (set it any time);
    ``process_query_error`` one the process-list calls raise (e.g. NVML_ERROR_NOT_SUPPORTED).
    ``mig_mode``: None for a GPU without MIG, else whether MIG mode is on; ``migs`` its MIG devices;
    ``privileged``: whether the caller may read the parent's aggregate process list in MIG mode."""
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
    mig_mode: bool | None = None
    migs: list[ScriptedMig] = field(default_factory=list)
    max_mig_devices: int = 7
    privileged: bool = False

    def used_now(self) -> int:
        script = list(self.used_script)
        value = script[min(self.memory_queries, len(script) - 1)]
        self.memory_queries += 1
        return value


@dataclass(frozen=True)
class _Handle:
    index: int
    generation: int
    slot: int | None = None  # a MIG device handle: its slot on GPU ``index``


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
        mig = self._mig(handle)
        return mig.uuid if mig is not None else self._gpu(handle).uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        self.calls["nvmlDeviceGetName"] += 1
        return self._gpu(handle).name

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        self.calls["nvmlDeviceGetMigMode"] += 1
        gpu = self._gpu(handle)
        if gpu.mig_mode is None or handle.slot is not None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig_mode else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        self.calls["nvmlDeviceGetMaxMigDeviceCount"] += 1
        gpu = self._gpu(handle)
        if gpu.mig_mode is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.max_mig_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        self.calls["nvmlDeviceGetMigDeviceHandleByIndex"] += 1
        gpu = self._gpu(handle)
        if not gpu.mig_mode:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not 0 <= index < gpu.max_mig_devices:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for mig in gpu.migs:
            if mig.slot == index and mig.visible:
                return _Handle(handle.index, self.generation, index)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        self.calls["nvmlDeviceGetGpuInstanceId"] += 1
        return self._mig_or_fail(handle).gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: _Handle) -> int:
        self.calls["nvmlDeviceGetComputeInstanceId"] += 1
        return self._mig_or_fail(handle).compute_instance_id

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> Any:
        if version is not None and not self.binding_has_memory_v2:
            raise TypeError("nvmlDeviceGetMemoryInfo() got an unexpected keyword "
                            "argument 'version'")
        self.calls["nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo"] += 1
        gpu = self._gpu(handle)
        if version and not self.driver_has_memory_v2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        mig = self._mig(handle)
        if mig is not None:
            used, total, reserved = mig.used_bytes, mig.total_bytes, 0
        else:
            used, total, reserved = gpu.used_now(), gpu.total_bytes, gpu.reserved_bytes
        if version:
            return pynvml.c_nvmlMemory_v2_t(version=version, total=total, reserved=reserved,
                                            free=total - reserved - used, used=used)
        v1_used = used + reserved
        return pynvml.c_nvmlMemory_t(total=total, free=total - v1_used, used=v1_used)

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

    def _mig(self, handle: _Handle) -> ScriptedMig | None:
        """The MIG device a MIG handle names (None for a GPU handle)."""
        if handle.slot is None:
            return None
        gpu = self._gpu(handle)
        for mig in gpu.migs:
            if mig.slot == handle.slot and mig.visible and gpu.mig_mode:
                return mig
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # reconfigured away

    def _mig_or_fail(self, handle: _Handle) -> ScriptedMig:
        mig = self._mig(handle)
        if mig is None:  # the instance-id getters answer only for MIG device handles
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig

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
        mig = self._mig(handle)
        entries: list[tuple[int, int | None, int, int]]
        if mig is not None:
            entries = [(pid, used, mig.gpu_instance_id, mig.compute_instance_id)
                       for pid, used in (mig.compute_processes if "Compute" in call else [])]
        elif gpu.mig_mode:  # the aggregate over instances: privileged callers only (nvml.h)
            if not gpu.privileged:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
            entries = [(pid, used, m.gpu_instance_id, m.compute_instance_id)
                       for m in gpu.migs for pid, used in (m.compute_processes if "Compute" in call else [])]
        else:
            entries = [(pid, used, _NO_INSTANCE, _NO_INSTANCE) for pid, used in
                       (gpu.compute_processes if "Compute" in call else gpu.graphics_processes)]
        out = []
        for pid, used, gi, ci in entries:
            raw = NOT_AVAILABLE if used is None else used
            obj = pynvml.nvmlStructToFriendlyObject(pynvml.c_nvmlProcessInfo_v2_t(
                pid=pid, usedGpuMemory=raw, gpuInstanceId=gi, computeInstanceId=ci))
            if self.binding_converts_not_available and obj.usedGpuMemory == NOT_AVAILABLE:
                obj.usedGpuMemory = None
            out.append(obj)
        return out
