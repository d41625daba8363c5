"""The memory breakdown on every sampler tick: gathers what ``memory_breakdown.py`` adds up (the
tick's sample, the instrumented models' weights and KV caches, the Python object heap) and keeps the
latest per device for ``memprof_memory_bytes``, ``GET /v1/memory``, the OOM recorder and the advice.

The sources it reads besides the sample are handed over by the composition root as one
``BreakdownSources`` (``breakdown_sources.py`` answers it from the sources registry; telemetry imports
no source). Each tick costs a walk of the models' parameters (``untyped_storage()`` per tensor:
about 0.1 ms for GPT-2's 150 tensors) and of their live caches; the Python heap's reading backs off
by its own cost (``sources/python_heap.py``). ``benchmarks/breakdown_tick.py`` measures the tick.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any, Callable, Protocol

from .._log import rate_limited
from ..attribution.handle import ModelHandle
from ..timeline import GpuReading, Sample
from .fork_renewal import STATE
from .gpu_identity import identify
from .memory_breakdown import DeviceBreakdown, Held, cpu_breakdown, cuda_breakdown, merge_held, series_rows
from .scrape import ScrapeContext, Row


class BreakdownSources(Protocol):
    """What the breakdown reads besides the tick's sample."""

    def python_heap(self) -> tuple[int, float] | None:
        """pymalloc's pools in use, in bytes, and the unix time they were read; None where unknown."""

    def python_heap_down(self) -> str | None:
        """Why the Python heap cannot be read here (None where it can)."""

    def cuda_uuids(self) -> Mapping[int, str]:
        """torch's CUDA device UUIDs by index (the NVML match)."""

    def mem_info(self, index: int) -> tuple[int, int] | None:
        """The device's (free, total) from cudaMemGetInfo: asked only where NVML cannot see this process."""

    def heap_read_at(self) -> float | None:
        """When glibc's figures were last read (their age in the document)."""

    def cpu_snapshot(self) -> tuple[dict[str, float], dict[str, float] | None] | None:
        """(RSS and its parts, glibc's figures or None) read back to back now, for a CPU breakdown
        of one moment (None: the tick's figures are used)."""


class NoBreakdownSources:
    """Nothing besides the sample: no Python heap, no UUIDs, no cudaMemGetInfo, no snapshot."""

    def python_heap(self) -> tuple[int, float] | None:
        return None

    def python_heap_down(self) -> str | None:
        return None

    def cuda_uuids(self) -> Mapping[int, str]:
        return {}

    def mem_info(self, index: int) -> tuple[int, int] | None:
        return None

    def heap_read_at(self) -> float | None:
        return None

    def cpu_snapshot(self) -> tuple[dict[str, float], dict[str, float] | None] | None:
        return None


NO_SOURCES = NoBreakdownSources()


class MemoryBreakdownWatch:
    """``on_sample`` is the sampler listener; ``breakdowns()``, ``series(scrape)``, ``document()``
    read the latest. ``handles()``: the live models (their weights and caches); ``sources``: what
    it reads besides the sample."""

    def __init__(self, handles: Callable[[], Mapping[str, ModelHandle]],
                 sources: BreakdownSources = NO_SOURCES, clock: Callable[[], float] = time.time) -> None:
        self._handles = handles
        self._sources = sources
        self._clock = clock
        self._lock = threading.Lock()
        self._latest: dict[str, DeviceBreakdown] = {}
        self.last_cost_s = 0.0
        self.errors = 0
        STATE.add(self.forget)  # a forked child's memory is its own from its first tick

    def forget(self) -> None:
        with self._lock:
            self._latest = {}

    # ---- the sampler listener ------------------------------------------------------------------
    def on_sample(self, sample: Sample) -> None:
        start = time.perf_counter()
        try:
            out = self.compute(sample)
        except Exception as e:  # noqa: BLE001 - telemetry never crashes the model: counted, logged
            self.errors += 1
            rate_limited.warning("memory-breakdown", "memprof_otel: the memory breakdown failed: %r", e)
            return
        with self._lock:
            self._latest = out
        self.last_cost_s = time.perf_counter() - start

    def held(self) -> Held:
        per_model: list[tuple[str, Mapping[str, Any]]] = []
        for name, h in sorted(self._handles().items()):
            try:
                per_model.append((name, h.held_tensors()))
            except Exception as e:  # noqa: BLE001 - one model's failure leaves its weights uncounted
                rate_limited.warning(f"held-tensors:{name}", "memprof_otel: %s: its weights could not be "
                                     "listed for the memory breakdown: %r", name, e)
                per_model.append((name, {}))
        return merge_held(per_model, self._clock())

    def compute(self, sample: Sample) -> dict[str, DeviceBreakdown]:
        held = self.held()
        out: dict[str, DeviceBreakdown] = {}
        cpu_sample, heap_at = sample, self._sources.heap_read_at()
        snap = self._sources.cpu_snapshot()
        if snap is not None and snap[0].get("resident_memory_bytes"):
            # RSS and glibc's heap read back to back now: the tick's own figures come from worker threads
            # at slightly different moments, and glibc's may be an earlier read (its back-off), which
            # under traffic is off by the transient tensors of a forward
            now = self._clock()
            glibc = snap[1] if snap[1] is not None else sample.allocators.get("cpu")
            cpu_sample = Sample(t=now, process=snap[0], allocators={"cpu": glibc} if glibc else {},
                                container=sample.container)
            heap_at = now if snap[1] is not None else heap_at
        cpu = cpu_breakdown(cpu_sample, held, self._sources.python_heap(), self._sources.python_heap_down(),
                            heap_at)
        if cpu is not None:
            out["cpu"] = cpu
        cuda = sorted(d for d in sample.allocators if d.startswith("cuda:"))
        if cuda:
            gpus = self._gpus_by_device(sample)
            for device in cuda:
                gpu = gpus.get(device)
                mem_info = None
                if gpu is None or gpu.process_used_bytes is None:
                    mem_info = self._sources.mem_info(int(device.partition(":")[2]))
                out[device] = cuda_breakdown(device, sample.allocators[device], sample.t, held, gpu, mem_info)
        return out

    def _gpus_by_device(self, sample: Sample) -> dict[str, GpuReading]:
        if not sample.gpus:
            return {}
        by_index = {str(g.index): g for g in sample.gpus}
        return {ident.device: by_index[ident.gpu] for ident in identify(self._sources.cuda_uuids(), sample.gpus)
                if ident.gpu in by_index}

    # ---- what readers get ----------------------------------------------------------------------
    def breakdowns(self) -> dict[str, DeviceBreakdown]:
        with self._lock:
            return dict(self._latest)

    def series(self, _scrape: ScrapeContext | None = None) -> dict[str, list[Row]]:
        return series_rows(self.breakdowns().values())

    def document(self) -> dict[str, Any]:
        """``GET /v1/memory``: every device's breakdown, as of the last sampler tick."""
        now = self._clock()
        latest = self.breakdowns()
        doc: dict[str, Any] = {"devices": {d: b.to_dict(now) for d, b in sorted(latest.items())},
                               "tick_cost_seconds": self.last_cost_s}
        if not latest:
            doc["reason"] = "no sampler tick yet (monitoring not started, or before its first tick)"
        return doc


__all__ = ["BreakdownSources", "MemoryBreakdownWatch", "NO_SOURCES", "NoBreakdownSources"]
