"""MIG devices of one GPU, as NVML enumerates them (helpers of ``NvmlSource``).

A GPU in MIG mode is split into GPU instances, each with its own slice of memory, and compute
instances inside them. NVML exposes each (GPU instance, compute instance) pair as a *MIG device*
with its own handle and ``MIG-...`` UUID: the identity ``CUDA_VISIBLE_DEVICES``, the Kubernetes
device plugin and dcgm-exporter (``UUID`` of the parent plus ``GPU_I_ID``) use. The parent GPU's
memory figures cover every instance; a workload's own limit is its instance's memory.

Slots are enumerated up to ``nvmlDeviceGetMaxMigDeviceCount``; an empty slot (or one that belongs
to another container, which NVML hides from us) answers NOT_FOUND / NO_PERMISSION and is skipped.
Any other error propagates: the caller records it and keeps the parent's figures.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MigDevice", "code", "mig_devices", "mig_enabled", "text"]

# nvml.h return codes and enum values; part of the C ABI, stable across driver and binding versions
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_NOT_FOUND = 6
_FUNCTION_NOT_FOUND = 13
_INVALID_ARGUMENT = 2
_MIG_ENABLE = 1  # NVML_DEVICE_MIG_ENABLE
_NO_MIG = frozenset({_NOT_SUPPORTED, _FUNCTION_NOT_FOUND})
_EMPTY_SLOT = frozenset({_NOT_FOUND, _NO_PERMISSION, _INVALID_ARGUMENT})


def text(value: Any) -> str:
    # pynvml before 11.5 returns bytes from the string getters; newer ones decode.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def code(exc: BaseException) -> int | None:
    return getattr(exc, "value", None)


@dataclass(frozen=True)
class MigDevice:
    slot: int
    handle: Any
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int


def mig_enabled(nvml: Any, handle: Any) -> bool | None:
    """The GPU's *current* MIG mode (a pending change applies only after a GPU reset); None when
    this GPU, driver or binding has no MIG at all (the answer will not change: cache it)."""
    fn = getattr(nvml, "nvmlDeviceGetMigMode", None)
    if fn is None:
        return None
    try:
        current, _pending = fn(handle)
    except nvml.NVMLError as e:
        if code(e) in _NO_MIG:
            return None
        raise
    return int(current) == _MIG_ENABLE


def mig_devices(nvml: Any, handle: Any) -> list[MigDevice]:
    """The MIG devices of a GPU in MIG mode that this process can see, in slot order."""
    out: list[MigDevice] = []
    for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError as e:
            if code(e) in _EMPTY_SLOT:
                continue
            raise
        out.append(MigDevice(slot, mig, text(nvml.nvmlDeviceGetUUID(mig)),
                             int(nvml.nvmlDeviceGetGpuInstanceId(mig)),
                             int(nvml.nvmlDeviceGetComputeInstanceId(mig))))
    return out
