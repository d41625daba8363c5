"""What the sampler reads and what an operation reads at its ends, from the sources registry.

``SampledSources.specs()`` lists the sources present in this process (process, cgroup, host heap,
each CUDA allocator, NVML) for a new sampler; its ``rss()`` and ``allocators()`` are the operations
tracker's cheap start and end readings. The registry (``sources/registry.py``, which builds each
source once) is handed over by the composition root: telemetry imports no source, so no scrape or
tick path can reach a device library through an import.
"""
from __future__ import annotations

from typing import Any, Protocol

from .sampler import SourceSpec, check_gpus

# An operation's rise is a peak minus its start level, so the start level must not predate it:
# glibc's figure is read at most every ~0.1 s (its cost stays under 0.1 %), and a reading older
# than this is left out of the operation (the live RSS and CUDA readings still measure it).
HOST_START_MAX_AGE_S = 0.1


class SourceRegistry(Protocol):
    """What is asked of ``sources/registry.py`` (the module itself is one): each source, or None
    where it cannot run here."""

    def process(self) -> Any: ...
    def cgroup(self) -> Any: ...
    def host_allocator(self) -> Any: ...
    def cuda_allocator(self, index: int) -> Any: ...
    def nvml(self) -> Any: ...
    def available_devices(self) -> list[int]: ...


class SampledSources:
    def __init__(self, registry: SourceRegistry) -> None:
        self._registry = registry

    def cuda_devices(self) -> list[int]:
        try:
            return self._registry.available_devices()
        except Exception:
            return []

    def specs(self) -> list[SourceSpec]:
        """The sampler's sources: every one this process has, each under its ``source`` label."""
        registry = self._registry
        specs: list[SourceSpec] = []
        if (p := registry.process()) is not None:
            specs.append(SourceSpec("process", p.stats))
        if (cg := registry.cgroup()) is not None:
            specs.append(SourceSpec("cgroup", cg.stats))
        if (h := registry.host_allocator()) is not None:
            specs.append(SourceSpec("cpu", h.stats))
        for i in self.cuda_devices():
            if (c := registry.cuda_allocator(i)) is not None:
                specs.append(SourceSpec(f"cuda:{i}", c.stats))
        nvml_fn = getattr(registry, "nvml", None)
        if nvml_fn is not None and (n := nvml_fn()) is not None:
            specs.append(SourceSpec("nvml", n.readings, check_gpus))
        return specs

    # ---- the operations tracker's probe: a statm pread, the CUDA allocators' live readings and
    # glibc's when it is fresh (a read within its back-off)
    def rss(self) -> int:
        p = self._registry.process()
        return p.reading().allocated if p is not None else 0

    def allocators(self) -> dict[str, int]:
        out: dict[str, int] = {}
        host = self._registry.host_allocator()
        if host is not None:
            fresh = host.fresh_reading(HOST_START_MAX_AGE_S)
            if fresh is not None:
                out["cpu"] = fresh.allocated
        for i in self.cuda_devices():
            src = self._registry.cuda_allocator(i)
            if src is not None:
                out[f"cuda:{i}"] = src.reading().allocated
        return out


__all__ = ["HOST_START_MAX_AGE_S", "SampledSources", "SourceRegistry"]
