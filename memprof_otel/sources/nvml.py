"""NVML source: device-wide GPU memory and this process's share, as the driver reports it.

What the CUDA allocator source cannot see: memory held by other processes, by the CUDA context
itself and by non-torch libraries (NCCL, cuDNN workspaces). One ``readings()`` per sampler tick
returns a ``GpuReading`` per NVML device.

Choices, in short:
- ``used`` comes from ``nvmlDeviceGetMemoryInfo_v2`` when the binding and driver have it: v1's
  ``used`` counts driver-reserved memory as used. Drivers without v2 fall back to v1, once.
- This process's share sums the compute (and graphics) process lists for our pid. A process with
  both kinds of context is listed twice with the same figure, so entries are counted once per
  (GPU instance, compute instance). ``None`` ("unknown") when NVML cannot say: an unsupported
  query, WDDM's "not available", or NVML cannot see our PID at all: the normal case in a
  container (``process_visibility.py`` decides). ``on_process_unknown`` hears each reason once;
  0 only when the lists work, can see us, and we are not on that GPU.
- A GPU in MIG mode also reports its MIG devices (``nvml_mig.py``), each with its own memory;
  there the per-process lists are read per MIG device (the parent's aggregate list needs
  privileges a container does not have).
- One failing device never hides the others: it is skipped, its error is recorded in
  ``last_errors``/``errors``, and its cached handle is dropped so the next tick retries. When every
  device fails, ``readings()`` raises ``NvmlReadError`` so the sampler counts a source failure.
- NVML handles do not survive ``fork()``: a pid check per call re-initialises NVML in the child.
- pynvml is imported lazily (importing this module stays side-effect free) and is injectable,
  so unit tests drive a scripted double on machines without a GPU.

NVML device indices follow PCI bus order, not CUDA's (``CUDA_DEVICE_ORDER``) nor
``CUDA_VISIBLE_DEVICES``: the ``gpu`` label is the NVML index, ``gpu_uuid`` joins the two.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, replace
from typing import Any, Callable

from memprof_otel._log import logger
from memprof_otel.errors import MemprofError, SourceUnavailable
from memprof_otel.sources.nvml_mig import code as _code, mig_devices, mig_enabled, text as _text
from memprof_otel.sources.process_visibility import ProcessVisibility, nvml_pid_blind_reason
from memprof_otel.timeline import GpuReading, MigReading

__all__ = ["NvmlReadError", "NvmlSource", "NvmlUnavailable"]

# nvml.h return codes; part of the C ABI, so stable across driver and binding versions.
_NOT_SUPPORTED = 3
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_ARGUMENT_VERSION_MISMATCH = 25
_NO_GPU_CODES = frozenset({_DRIVER_NOT_LOADED, _LIBRARY_NOT_FOUND})
# A v2 memory call failing with one of these means "this driver has no v2", not "device broken".
_NO_V2_CODES = frozenset({_NOT_SUPPORTED, _FUNCTION_NOT_FOUND, _ARGUMENT_VERSION_MISMATCH})
_NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE (ulonglong); older pynvml passes it raw

_getpid = os.getpid  # module attribute so tests can simulate a fork without forking


class NvmlUnavailable(SourceUnavailable):
    """NVML cannot run here. ``no_gpu`` is True for the ordinary CPU-host case (no pynvml, no
    library, no driver), False when NVML exists but is broken (permissions, version mismatch)."""

    def __init__(self, detail: str, *, no_gpu: bool = False) -> None:
        self.detail = detail
        self.no_gpu = no_gpu
        super().__init__(f"NVML unavailable: {detail}")


class NvmlReadError(MemprofError, RuntimeError):
    """A ``readings()`` call got nothing: every device failed, or NVML could not be re-initialised
    after a fork. The sampler counts it as a source failure; the next tick tries again."""


@dataclass(frozen=True)
class _Device:
    index: int
    handle: Any
    uuid: str
    model: str


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class NvmlSource:
    """GPU device figures from NVML (``name="nvml"``). ``nvml`` is a module with the pynvml API
    (default ``import pynvml``); ``pid`` is whose memory ``process_used_bytes`` reports (default:
    the calling process, re-read after a fork, checked against its PID namespace; a ``pid`` given
    is taken to be the PID as NVML sees it, with no namespace check). Raises ``NvmlUnavailable``
    when NVML cannot start.

    ``holds_cuda_memory``: does this process hold CUDA memory now (torch's reserved bytes > 0)?
    The evidence that we have a context, so that not being listed anywhere means NVML cannot see
    us. ``pid_namespace``: the namespace check (injectable for tests). ``on_process_unknown``:
    called once per reason when a per-process figure becomes unknown (registry: source down).

    ``errors`` counts per-device failures since construction; ``last_errors`` lists those of the
    latest ``readings()``/``device_info()`` call (empty when all went well). ``process_unknown``
    is why NVML cannot see this process (None while it can).
    """

    name = "nvml"

    def __init__(self, nvml: Any = None, pid: int | None = None, *,
                 holds_cuda_memory: Callable[[], bool] | None = None,
                 pid_namespace: Callable[[int], str | None] | None = None,
                 on_process_unknown: Callable[[str], None] | None = None) -> None:
        if nvml is None:
            try:
                import pynvml as nvml  # why: optional: the NVML bindings may be absent
            except ImportError as e:
                raise NvmlUnavailable(f"pynvml is not importable ({e}); install nvidia-ml-py",
                                      no_gpu=True) from e
        self._nvml = nvml
        self._pid = pid
        self._holds_cuda_memory = holds_cuda_memory
        self._visibility = ProcessVisibility(pid_namespace if pid_namespace is not None else (
            nvml_pid_blind_reason if pid is None else None), on_process_unknown)
        self._no_mig: set[int] = set()  # devices (by index) whose GPU or driver has no MIG at all
        self._lock = threading.Lock()
        self._devices: dict[int, _Device] = {}
        self._v1_only: set[str] = set()        # devices (by UUID) whose driver has no v2 memory info
        self._process_fns: dict[str, Any] = {}  # "Compute"/"Graphics" -> the list call that works
        self._count = 0
        self._driver = ""
        self._init_pid: int | None = None
        self._closed = False
        self.errors = 0
        self.last_errors: list[str] = []
        try:
            self._init()
        except nvml.NVMLError as e:
            raise NvmlUnavailable(str(e), no_gpu=_code(e) in _NO_GPU_CODES) from e

    def __repr__(self) -> str:
        return f"NvmlSource(devices={self._count}, driver={self._driver!r})"

    @property
    def process_unknown(self) -> str | None:
        """Why NVML cannot see this process (None while it can)."""
        return self._visibility.reason

    # -- public ---------------------------------------------------------------------------------
    def readings(self) -> tuple[GpuReading, ...]:
        """One reading per device that answered. Raises ``NvmlReadError`` if none did (with at
        least one device present) and ``SourceUnavailable`` after ``close()``."""
        with self._lock:
            self._ensure_initialised()
            pid = self._pid if self._pid is not None else _getpid()
            self._visibility.check_namespace(pid)
            # asked before the lists are read: memory held then means a context listed by then
            holds = (self.process_unknown is None and self._holds_cuda_memory is not None
                     and self._holds_cuda_memory())
            out: list[GpuReading] = []
            listed: list[bool] = []  # per device whose lists answered: is our pid on it
            errs: list[str] = []
            last: BaseException | None = None
            for index in range(self._count):
                try:
                    reading, seen = self._read(index, pid, errs)
                    out.append(reading)
                    if seen is not None:
                        listed.append(seen)
                # A binding or driver can raise anything here (NVMLError, NVMLLibraryMismatchError,
                # ctypes errors); one device's trouble must not cost the others their reading.
                except Exception as e:  # noqa: BLE001
                    self._devices.pop(index, None)
                    errs.append(f"gpu {index}: {_describe(e)}")
                    last = e
            self._record(errs)
            if self._count and not out:
                raise NvmlReadError(f"NVML: all {self._count} device(s) failed: "
                                    + "; ".join(errs)) from last
            self._visibility.judge(holds, listed, pid)
            if self.process_unknown is not None:
                out = [replace(r, process_used_bytes=None) for r in out]
            return tuple(out)

    def device_info(self) -> list[dict[str, Any]]:
        """Static facts per device for ``memprof-otel info``: index, uuid, model, driver_version,
        total_bytes. A device that fails is listed as ``{"index": i, "error": "..."}``."""
        with self._lock:
            self._ensure_initialised()
            out: list[dict[str, Any]] = []
            errs: list[str] = []
            for index in range(self._count):
                try:
                    dev = self._device(index)
                    _, total = self._memory(dev.uuid, dev.handle)
                except Exception as e:  # noqa: BLE001 - same reasoning as readings()
                    self._devices.pop(index, None)
                    errs.append(f"gpu {index}: {_describe(e)}")
                    out.append({"index": index, "error": _describe(e)})
                    continue
                info: dict[str, Any] = {"index": index, "uuid": dev.uuid, "model": dev.model,
                                        "driver_version": self._driver, "total_bytes": total}
                try:
                    migs = self._migs(dev)
                except Exception as e:  # noqa: BLE001 - the device figures are still good
                    errs.append(f"gpu {index} MIG: {_describe(e)}")
                    migs = None
                if migs:
                    info["mig_devices"] = [{"uuid": m.uuid, "gpu_instance_id": m.gpu_instance_id,
                                            "compute_instance_id": m.compute_instance_id,
                                            "total_bytes": self._memory(m.uuid, m.handle)[1]}
                                           for m in migs]
                out.append(info)
            self._record(errs)
            return out

    def close(self) -> None:
        """Shut NVML down (once; later calls do nothing). Never raises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._devices.clear()
            # In a forked child that never re-initialised, the init belongs to the parent.
            if self._init_pid != _getpid():
                return
            try:
                self._nvml.nvmlShutdown()
            except Exception as e:  # noqa: BLE001 - shutdown is best effort
                logger.debug("memprof_otel: nvmlShutdown failed: %s", _describe(e))

    # -- internals (caller holds self._lock, except from __init__) --------------------------------
    def _init(self) -> None:
        nvml = self._nvml
        nvml.nvmlInit()
        try:
            count = int(nvml.nvmlDeviceGetCount())
            driver = _text(nvml.nvmlSystemGetDriverVersion())
        except Exception:
            try:
                nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 - the first error is the one worth reporting
                pass
            raise
        self._devices.clear()
        self._process_fns.clear()
        self._count, self._driver = count, driver
        self._init_pid = _getpid()  # only once everything worked: a failure retries next call

    def _ensure_initialised(self) -> None:
        if self._closed:
            raise SourceUnavailable("NVML source is closed")
        if self._init_pid == _getpid():
            return
        try:
            self._init()
        except Exception as e:  # noqa: BLE001 - reported as one source failure, retried next tick
            raise NvmlReadError(f"NVML: re-initialisation after fork failed: {_describe(e)}") from e

    def _record(self, errs: list[str]) -> None:
        self.errors += len(errs)
        self.last_errors = errs

    def _device(self, index: int) -> _Device:
        dev = self._devices.get(index)
        if dev is None:
            nvml = self._nvml
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            dev = _Device(index, handle, _text(nvml.nvmlDeviceGetUUID(handle)),
                          _text(nvml.nvmlDeviceGetName(handle)))
            self._devices[index] = dev
        return dev

    def _read(self, index: int, pid: int, errs: list[str]) -> tuple[GpuReading, bool | None]:
        """The device's reading, and whether our pid is on its process lists (None: no lists)."""
        dev = self._device(index)
        used, total = self._memory(dev.uuid, dev.handle)
        try:
            migs = self._migs(dev)
        except Exception as e:  # noqa: BLE001 - the device figures are still good
            errs.append(f"gpu {index} MIG: {_describe(e)}")
            migs = None
        mig_readings: list[MigReading] = []
        for m in migs or ():
            try:
                m_used, m_total = self._memory(m.uuid, m.handle)
            except Exception as e:  # noqa: BLE001 - one MIG device must not cost the others
                errs.append(f"gpu {index} MIG {m.uuid}: {_describe(e)}")
                continue
            mig_readings.append(MigReading(m.uuid, m.gpu_instance_id, m.compute_instance_id,
                                           m_used, m_total))
        # in MIG mode, per-instance lists: the parent's aggregate one needs privileges
        handles = [m.handle for m in migs] if migs is not None else [dev.handle]
        seen: bool | None
        try:
            seen, process_used = self._process_used(handles, pid)
            why = "NVML cannot list this GPU's processes here (not supported)"
        except Exception as e:  # noqa: BLE001 - the device figures are still good
            errs.append(f"gpu {index} processes: {_describe(e)}")
            seen, process_used = None, None
            why = f"NVML's process lists failed: {_describe(e)}"
        if seen is None and self.process_unknown is None:
            self._visibility.tell(f"gpu {index}: {why}")
        reading = GpuReading(index=index, uuid=dev.uuid, model=dev.model, driver_version=self._driver,
                             used_bytes=used, total_bytes=total, process_used_bytes=process_used,
                             migs=tuple(mig_readings))
        return reading, seen

    def _migs(self, dev: _Device) -> list[Any] | None:
        """The device's MIG devices when it is in MIG mode now, else None."""
        if dev.index in self._no_mig:
            return None
        enabled = mig_enabled(self._nvml, dev.handle)
        if enabled is None:
            self._no_mig.add(dev.index)  # no MIG on this GPU or driver: never asked again
            return None
        return mig_devices(self._nvml, dev.handle) if enabled else None

    def _memory(self, key: str, handle: Any) -> tuple[int, int]:
        nvml = self._nvml
        version = getattr(nvml, "nvmlMemory_v2", None)
        if version is not None and key not in self._v1_only:
            try:
                info = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
                return int(info.used), int(info.total)
            except TypeError:  # a binding whose nvmlDeviceGetMemoryInfo takes no version
                pass
            except nvml.NVMLError as e:
                if _code(e) not in _NO_V2_CODES:
                    raise
            self._v1_only.add(key)
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
        return int(info.used), int(info.total)

    def _process_used(self, handles: list[Any], pid: int) -> tuple[bool | None, int | None]:
        """(are we listed, our bytes) over the process lists of ``handles``; (None, None) when
        the lists cannot be read, (True, None) when we are listed without a usable figure."""
        compute: list[Any] = []
        graphics: list[Any] = []
        for handle in handles:
            c = self._processes("Compute", handle)
            if c is None:  # torch allocates through compute contexts: unknown means unknown
                return None, None
            compute += c
            graphics += self._processes("Graphics", handle) or []
        per_instance: dict[tuple[Any, Any], int] = {}
        seen = False
        for proc in (*compute, *graphics):
            if getattr(proc, "pid", None) != pid:
                continue
            seen = True
            mem = getattr(proc, "usedGpuMemory", None)
            if mem is None or mem == _NOT_AVAILABLE:
                return True, None
            key = (getattr(proc, "gpuInstanceId", None), getattr(proc, "computeInstanceId", None))
            per_instance[key] = max(per_instance.get(key, 0), int(mem))
        return seen, sum(per_instance.values())

    def _processes(self, kind: str, handle: Any) -> list[Any] | None:
        """The running-process list of one kind, or None when this driver cannot give it.

        pynvml's unversioned call uses the v3 struct and raises ``NVMLLibraryMismatchError`` on
        drivers older than that (R470 and before); those still have ``_v2``.
        """
        nvml = self._nvml
        fn = self._process_fns.get(kind)
        candidates = [fn] if fn is not None else [
            f for f in (getattr(nvml, f"nvmlDeviceGet{kind}RunningProcesses", None),
                        getattr(nvml, f"nvmlDeviceGet{kind}RunningProcesses_v2", None))
            if f is not None]
        mismatch = getattr(nvml, "NVMLLibraryMismatchError", ())
        for candidate in candidates:
            try:
                procs = list(candidate(handle))
            except nvml.NVMLError as e:
                if _code(e) == _NOT_SUPPORTED:
                    return None
                if _code(e) != _FUNCTION_NOT_FOUND:
                    raise
                continue
            except mismatch:
                continue
            self._process_fns[kind] = candidate
            return procs
        return None
