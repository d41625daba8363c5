"""What the memory breakdown reads besides the sampler's tick, from the sources registry.

``RegistrySources`` answers ``breakdown_service.BreakdownSources`` over the registry
(``sources/registry.py``, which builds each source once), handed over by the composition root:
telemetry imports no source, so no tick path can reach a device library through an import.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

# glibc's read is forced for the breakdown's snapshot only while it is cheap (mallinfo2 walks every
# free chunk: milliseconds on a badly fragmented heap, where its back-off keeps serving the last read)
SNAPSHOT_MAX_HEAP_COST_S = 0.0005


class BreakdownRegistry(Protocol):
    """What is asked of ``sources/registry.py`` (the module itself is one): each source, or None
    where it cannot run here, and the registry's own records."""

    def process(self) -> Any: ...
    def host_allocator(self) -> Any: ...
    def cuda_allocator(self, index: int) -> Any: ...
    def python_heap(self) -> Any: ...
    def down_reasons(self) -> Mapping[str, str]: ...
    def cuda_uuids(self) -> Mapping[int, str]: ...


class RegistrySources:
    def __init__(self, registry: BreakdownRegistry) -> None:
        self._registry = registry

    def python_heap(self) -> tuple[int, float] | None:
        """pymalloc's pools in use and when they were read (None where this interpreter cannot tell)."""
        src = self._registry.python_heap()
        if src is None:
            return None
        r = src.read()
        return r.resident_bytes, r.read_at

    def python_heap_down(self) -> str | None:
        return self._registry.down_reasons().get("python_heap")

    def cuda_uuids(self) -> Mapping[int, str]:
        return self._registry.cuda_uuids()

    def mem_info(self, index: int) -> tuple[int, int] | None:
        """(free, total) of a CUDA device from cudaMemGetInfo, where its allocator source exists."""
        src = self._registry.cuda_allocator(index)
        found = src.device_memory() if src is not None else None
        return (found[0], found[1]) if found is not None else None

    def heap_read_at(self) -> float | None:
        host = self._registry.host_allocator()
        return host.last_read_unix if host is not None else None

    def cpu_snapshot(self) -> tuple[dict[str, float], dict[str, float] | None] | None:
        """RSS with its parts and glibc's figures, read back to back (the CPU breakdown's moment)."""
        proc = self._registry.process()
        if proc is None:
            return None
        host = self._registry.host_allocator()
        glibc = None
        if host is not None and host.cost_ema_s <= SNAPSHOT_MAX_HEAP_COST_S:
            glibc = host.read(force=True)
        return proc.rss_parts(), glibc


__all__ = ["BreakdownRegistry", "RegistrySources", "SNAPSHOT_MAX_HEAP_COST_S"]
