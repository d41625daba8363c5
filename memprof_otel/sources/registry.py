"""Process-wide memory sources, created on first use and shared by hooks, sampler and exporters.

One object per device so that peak folding (CUDA) and read back-off (glibc) see every reader.
A source that cannot run here is remembered as down with its reason; callers get ``None``.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .._log import logger, warn_once
from ..errors import SourceUnavailable
from .cgroup import CgroupSource
from .cuda import CudaAllocatorSource, available_devices, device_uuids
from .cuda_history import CudaHistoryRecorder
from .cuda_trace import CudaAllocatorTrace
from .glibc import HostAllocatorSource
from .nvml import NvmlSource
from .process import ProcessSource
from .python_heap import PythonHeapSource

_lock = threading.Lock()
_sources: dict[str, Any] = {}
_down: dict[str, str] = {}
_uuids: dict[int, str] = {}  # CUDA index -> torch's UUID, once torch has initialised CUDA

S = TypeVar("S")


def _get(name: str, make: Callable[[], S],
         on_down: Callable[[str, Exception], None] | None = None) -> S | None:
    """``on_down(reason, exc)`` runs once, when the source is first found down (under the lock)."""
    with _lock:
        if name in _sources:
            return _sources[name]  # what make() built under this name
        if name in _down:
            return None
        try:
            src = make()
        except Exception as e:  # a broken backend is a down source, not a crash
            reason = str(e) if isinstance(e, SourceUnavailable) else f"{type(e).__name__}: {e}"
            _down[name] = reason
            if on_down is not None:
                on_down(reason, e)
            return None
        _sources[name] = src
        return src


def host_allocator() -> HostAllocatorSource | None:
    return _get("cpu", HostAllocatorSource)


def cuda_allocator(index: int) -> CudaAllocatorSource | None:
    return _get(f"cuda:{index}", lambda: CudaAllocatorSource(index))


def cuda_trace(max_entries: int) -> CudaAllocatorTrace | None:
    """The process's allocator trace for attributed CUDA forwards (one for every device and model:
    torch's history ring is process-wide); None where this torch cannot trace (``memprof_source_up
    {source="cuda_trace"} 0`` with the reason). The first caller's ``max_entries`` sizes the ring."""
    return _get("cuda_trace", lambda: CudaAllocatorTrace(max_entries))


def cuda_trace_in_flight() -> int:
    """Traced forwards running now (0 when the trace was never built)."""
    with _lock:
        trace = _sources.get("cuda_trace")
    return trace.in_flight if trace is not None else 0


def process() -> ProcessSource | None:
    return _get("process", ProcessSource)


def python_heap() -> PythonHeapSource | None:
    """None (``memprof_source_up{source="python_heap"} 0``, with the reason) where this interpreter
    cannot tell its object heap's size."""
    return _get("python_heap", PythonHeapSource)


def cgroup() -> CgroupSource | None:
    """None (and ``memprof_source_up{source="cgroup"} 0``) where the process has no readable
    memory cgroup: its figures are then absent, never 0."""
    return _get("cgroup", CgroupSource)


def nvml() -> NvmlSource | None:
    return _get("nvml", lambda: NvmlSource(holds_cuda_memory=holds_cuda_memory,
                                           on_process_unknown=_nvml_process_unknown),
                on_down=_log_nvml_down)


def holds_cuda_memory() -> bool:
    """Does torch's caching allocator of this process hold memory on any CUDA device? (Evidence
    that the process has a CUDA context.) Never initialises CUDA; never raises."""
    for i in available_devices():
        try:
            src = cuda_allocator(i)
            if src is not None and src.reserved() > 0:
                return True
        except Exception:  # noqa: BLE001 - a failing read is "no evidence" from that device
            continue
    return False


def cuda_uuids() -> dict[int, str]:
    """CUDA index -> torch's device UUID; empty until torch has initialised CUDA, then read once
    (a device's UUID does not change while the process lives)."""
    with _lock:
        if _uuids:
            return dict(_uuids)
    found = device_uuids()
    with _lock:
        _uuids.update(found)
        return dict(_uuids)


def _nvml_process_unknown(reason: str) -> None:
    """NVML cannot give this process's GPU memory: ``memprof_source_up{source="nvml_process"} 0``,
    the reason in ``/v1/status``, and one log line."""
    mark_down("nvml_process", reason)
    warn_once("nvml-process", "memprof_otel: this process's GPU memory from NVML is unknown (%s); "
              "memprof_gpu_process_memory_used_bytes is left out, memprof_gpu_process_torch_reserved_bytes "
              "(torch's reserved bytes: no CUDA context, no other libraries) stands in", reason)


def _log_nvml_down(reason: str, exc: Exception) -> None:
    # No NVML on a CPU host is normal (INFO); NVML present but failing is worth a WARNING.
    level = logging.INFO if getattr(exc, "no_gpu", False) else logging.WARNING
    logger.log(level, "memprof_otel: NVML unavailable (%s); GPU device metrics off",
               getattr(exc, "detail", reason))


def mark_down(name: str, reason: str) -> None:
    """Record a source that cannot run here (e.g. the tensor ledger on a torch without dispatch
    modes): ``memprof_source_up{source=name} 0`` and the reason in ``/v1/status``."""
    with _lock:
        _sources.pop(name, None)
        _down[name] = reason


def down_reasons() -> dict[str, str]:
    with _lock:
        return dict(_down)


def reset_for_tests() -> None:
    with _lock:
        _sources.clear()
        _down.clear()
        _uuids.clear()


def cuda_history_recorder(index: int, max_entries: int) -> CudaHistoryRecorder | None:
    """A fresh allocator-history recorder for one capture (None when it cannot be built)."""
    try:
        return CudaHistoryRecorder(index, max_entries)
    except Exception:
        return None
