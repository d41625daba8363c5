"""CUDA memory source: torch's caching allocator on one device.

Reads the raw nested stats (``torch._C._cuda_memoryStats``) once per call; the public
``torch.cuda.memory_allocated``/``memory_stats`` flatten and sort the whole dict (~165 us), which a
per-layer hook cannot afford. A torch without the private name gets the public one (``_raw_fns``). The torch calls are injectable so unit tests drive a scripted
allocator double instead of hardware. torch is imported lazily: importing this module must stay
cheap and side-effect free.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from memprof_otel._log import warn_once
from memprof_otel.errors import SourceUnavailable
from memprof_otel.sources import cuda_stats
from memprof_otel.sources.base import Reading

__all__ = ["CudaAllocatorSource", "CudaPeakWatch", "ResetPeakFn", "StatsFn", "available_devices",
           "device_uuids"]

StatsFn = Callable[[int], Mapping[str, Any]]
ResetPeakFn = Callable[[int], None]
_new_reading = tuple.__new__  # Reading(...) through its Python __new__ costs 3x more


def _unavailable_reason(device_index: int | None = None) -> str | None:
    """Why CUDA cannot be read here, or None when it can. Never raises."""
    try:
        import torch  # why: CUDA is asked about only on demand; never initialise it at import

        if getattr(torch.version, "cuda", None) is None and getattr(torch.version, "hip", None) is None:
            return f"torch {torch.__version__} was built without CUDA"
        if not torch.cuda.is_available():
            return "torch.cuda.is_available() is False (no driver or no visible device)"
        count = torch.cuda.device_count()
        if device_index is not None and not 0 <= device_index < count:
            return f"device index {device_index} out of range ({count} CUDA device(s) visible)"
    # CPU-only and half-broken builds raise all sorts (RuntimeError from torch.accelerator,
    # AttributeError from torch.cuda internals, driver errors): any of them means "not here".
    except Exception as exc:  # noqa: BLE001
        return f"CUDA probe failed: {type(exc).__name__}: {exc}"
    return None


def available_devices() -> list[int]:
    """Indices of the CUDA devices this process can read; [] on CPU-only builds. Never raises."""
    if _unavailable_reason() is not None:
        return []
    try:
        import torch  # why: CUDA is asked about only on demand; never initialise it at import

        return list(range(torch.cuda.device_count()))
    except Exception:  # noqa: BLE001 - same reasoning as _unavailable_reason
        return []


def device_uuids() -> dict[int, str]:
    """CUDA index -> the device's UUID as torch reports it (``get_device_properties(i).uuid``: the
    hex form without NVML's ``GPU-``/``MIG-`` prefix), in this process's numbering (after
    ``CUDA_VISIBLE_DEVICES``). Empty until torch has initialised CUDA: asking earlier would create
    the CUDA runtime state ourselves. Never raises."""
    if _unavailable_reason() is not None:
        return {}
    try:
        import torch  # why: CUDA is asked about only on demand; never initialise it at import

        if not torch.cuda.is_initialized():
            return {}
        return {i: str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())}
    except Exception:  # noqa: BLE001 - same reasoning as _unavailable_reason
        return {}


def _raw_fns(torch: Any) -> tuple[StatsFn, ResetPeakFn]:
    """torch's private nested-stats reader and peak reset, or the public pair when this torch
    moved the private names (``memory_stats`` flattens and sorts the dict, ~165 us a read, so the
    per-layer cost grows and the overhead budget attributes fewer forwards; figures are the same)."""
    raw_stats = getattr(torch._C, "_cuda_memoryStats", None)
    raw_reset = getattr(torch._C, "_cuda_resetPeakMemoryStats", None)
    if callable(raw_stats) and callable(raw_reset):
        return raw_stats, raw_reset

    warn_once("cuda-stats", "memprof_otel: this torch (%s) has no torch._C._cuda_memoryStats/"
              "_cuda_resetPeakMemoryStats; reading torch.cuda.memory_stats() instead (same figures, "
              "slower per read)", getattr(torch, "__version__", "?"))
    public_stats = torch.cuda.memory_stats

    def stats_from_public(index: int) -> Mapping[str, Any]:
        return cuda_stats.nested_from_flat(public_stats(index))

    return stats_from_public, torch.cuda.reset_peak_memory_stats


def _default_fns(device_index: int, torch: Any = None) -> tuple[StatsFn, ResetPeakFn]:
    """``torch``: injectable so tests can hand in a torch without the private names."""
    if torch is None:
        reason = _unavailable_reason(device_index)
        if reason is not None:
            raise SourceUnavailable(f"cuda:{device_index}: {reason}")
        import torch  # why: CUDA is asked about only on demand; never initialise it at import

    raw_stats, raw_reset = _raw_fns(torch)
    is_initialized: Callable[[], bool] = torch.cuda.is_initialized

    # Until CUDA is initialised the allocator has no per-device state and the raw calls raise
    # ("did you call init?"). Nothing can have been allocated yet, so an empty dict (all zeros)
    # is the truth. We never initialise CUDA ourselves: that creates a context on the device and
    # makes a later fork() unusable for the host application.
    def stats_fn(index: int) -> Mapping[str, Any]:
        return raw_stats(index) if is_initialized() else {}

    def reset_peak_fn(index: int) -> None:
        if is_initialized():
            raw_reset(index)

    return stats_fn, reset_peak_fn


class CudaAllocatorSource:
    """``MemorySource`` over torch's CUDA caching allocator for one device (``name="cuda:N"``).

    Per-layer attribution resets the device peak many times per forward, so the device's own
    peak only means "peak since the last layer boundary". This source folds the device peak into
    a process-lifetime maximum before every reset, so ``stats()["allocated_peak_bytes"]`` (and the
    reserved peak, which torch resets at the same time) never goes down because of our resets.
    """

    available_devices = staticmethod(available_devices)

    def __init__(self, device_index: int, *, stats_fn: StatsFn | None = None,
                 reset_peak_fn: ResetPeakFn | None = None,
                 mem_info_fn: Callable[[int], tuple[int, int]] | None = None,
                 fraction_fn: Callable[[int], float | None] | None = None) -> None:
        if isinstance(device_index, bool) or not isinstance(device_index, int) or device_index < 0:
            raise ValueError(f"device_index must be an int >= 0, not {device_index!r}")
        if stats_fn is None or reset_peak_fn is None:
            default_stats, default_reset = _default_fns(device_index)
            stats_fn = stats_fn or default_stats
            reset_peak_fn = reset_peak_fn or default_reset
        self.name: str = f"cuda:{device_index}"
        self.device_index: int = device_index
        self._stats_fn: StatsFn = stats_fn
        self._reset_peak_fn: ResetPeakFn = reset_peak_fn
        self._mem_info_fn = mem_info_fn
        self._fraction_fn = fraction_fn
        self._name_of_device: str | None = None
        # Guards the read-fold-reset sequence so a concurrent stats() cannot observe a reset
        # device peak before it has been folded into the lifetime maxima.
        self._lock = threading.Lock()
        self._lifetime_peak: int | float = 0
        self._lifetime_reserved_peak: int | float = 0

    def __repr__(self) -> str:
        return f"CudaAllocatorSource({self.device_index})"

    def _read(self) -> Mapping[str, Any]:
        with self._lock:
            return self._stats_fn(self.device_index)

    def allocated(self) -> int:
        return int(cuda_stats.stat(self._read(), "allocated_bytes", "all", "current"))

    def reserved(self) -> int:
        return int(cuda_stats.stat(self._read(), "reserved_bytes", "all", "current"))

    def peak_since_reset(self) -> int:
        """The device's allocated peak since our (or anyone's) last reset."""
        return int(cuda_stats.stat(self._read(), "allocated_bytes", "all", "peak"))

    def reading(self) -> Reading:
        return cuda_stats.reading(self._read())

    def device_memory(self) -> tuple[int, int, bool] | None:
        """(free, total, is a MIG slice) of the device as the driver sees it (``cudaMemGetInfo``:
        every process's use and this one's non-allocator memory counted; a MIG slice's own
        figures inside one). No synchronisation; a few microseconds. None before CUDA is
        initialised: asking would create a context (see ``_default_fns``)."""
        if self._mem_info_fn is not None:
            free, total = self._mem_info_fn(self.device_index)
            return int(free), int(total), False
        import torch  # loaded already: this source only exists where torch has CUDA

        if not torch.cuda.is_initialized():
            return None
        if self._name_of_device is None:
            self._name_of_device = str(torch.cuda.get_device_name(self.device_index))
        free, total = torch.cuda.mem_get_info(self.device_index)
        return int(free), int(total), " MIG " in f" {self._name_of_device} "

    def memory_fraction(self) -> float | None:
        """The share of the device ``torch.cuda.set_per_process_memory_fraction()`` gave this process's
        allocator (1.0 when unset); None where it cannot be read (CUDA not initialised yet, a torch
        without ``get_per_process_memory_fraction``). Never raises."""
        try:
            if self._fraction_fn is not None:
                return self._fraction_fn(self.device_index)
            import torch  # loaded already: this source only exists where torch has CUDA

            get = getattr(torch.cuda, "get_per_process_memory_fraction", None)
            if get is None or not torch.cuda.is_initialized():
                return None
            return float(get(self.device_index))
        except Exception:  # noqa: BLE001 - a limit unread is a limit not applied, never a crash
            return None

    def reset_peak(self) -> None:
        """Fold the device peaks into the lifetime maxima, then reset them.

        If the stats cannot be read, the reset is skipped (and the error propagates): resetting
        without folding would silently lose the lifetime peak.
        """
        with self._lock:
            nested = self._stats_fn(self.device_index)
            self._fold(nested)
            self._reset_peak_fn(self.device_index)

    def read_and_reset(self) -> Reading:
        """One stats read for a per-layer hook: the reading, folded, then the peak reset.

        The per-boundary hot path (``cuda.attribution: boundary_reads``): the dict is indexed
        directly, with one type check per figure, instead of walked through ``cuda_stats.stat``
        eight times (~37 us on an H100, more than the read itself). Anything unexpected (a key
        missing, a value that is not a count) takes the validated path, which reads missing keys as
        0 and raises on garbage, as before."""
        with self._lock:
            nested = self._stats_fn(self.device_index)
            try:
                a = nested["allocated_bytes"]["all"]
                r = nested["reserved_bytes"]["all"]
                n = nested["allocation"]["all"]
                allocated, peak, reserved, reserved_peak = a["current"], a["peak"], r["current"], r["peak"]
                allocations, frees = n["allocated"], n["freed"]
                split = nested["inactive_split_bytes"]["all"]["current"]
                figures = (allocated, peak, reserved, reserved_peak, allocations, frees, split)
                fast = all(type(x) is int and x >= 0 for x in figures)
            except (KeyError, TypeError):
                fast = False
            if not fast:
                self._fold(nested)
                self._reset_peak_fn(self.device_index)
                return cuda_stats.reading(nested)
            if peak > self._lifetime_peak:
                self._lifetime_peak = peak
            if reserved_peak > self._lifetime_reserved_peak:
                self._lifetime_reserved_peak = reserved_peak
            self._reset_peak_fn(self.device_index)
        return _new_reading(Reading, (allocated, reserved, peak, allocations, frees,
                                      min(1.0, split / reserved) if reserved > 0 else 0.0, 0))

    def stats(self) -> dict[str, float]:
        """``cuda_stats.figures`` with both peaks replaced by their process-lifetime maxima."""
        with self._lock:
            nested = self._stats_fn(self.device_index)
            out = cuda_stats.figures(nested)
            self._fold(nested)
            out["allocated_peak_bytes"] = self._lifetime_peak
            out["reserved_peak_bytes"] = self._lifetime_reserved_peak
        return out

    def _fold(self, nested: Mapping[str, Any]) -> None:
        # Caller holds self._lock.
        peak = cuda_stats.stat(nested, "allocated_bytes", "all", "peak")
        reserved_peak = cuda_stats.stat(nested, "reserved_bytes", "all", "peak")
        self._lifetime_peak = max(self._lifetime_peak, peak)
        self._lifetime_reserved_peak = max(self._lifetime_reserved_peak, reserved_peak)


class CudaPeakWatch:
    """A per-layer hot counter over one device that never resets torch's peak register (mode
    ``cuda.reset_peak_stats: false``), for forwards the tensor ledger cannot see into (compiled
    code allocates outside the dispatcher).

    The register only rises between resets, so a rise since the previous read is exactly the peak
    since then. Without a rise the peak in between is not known (it stayed below an older peak):
    the current level is reported, a lower bound. A reset by the host application (the register
    drops) is taken as "no rise" until the register passes its new mark.
    """

    def __init__(self, source: CudaAllocatorSource) -> None:
        self.source = source
        self._mark: int | None = None

    def reset_peak(self) -> None:
        """Only remembers the register: torch's own peak is left alone."""
        self._mark = self.source.reading().peak

    def read_and_reset(self) -> Reading:
        r = self.source.reading()
        register = r.peak
        rose = self._mark is not None and register > self._mark
        self._mark = register
        return r._replace(peak=register if rose else r.allocated, reserved_peak=r.reserved)
