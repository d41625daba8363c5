"""``LayerMemoryStats`` and the accumulator that folds ``LayerCall`` records into it."""
from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from .peaks import LayerCall


@dataclass(frozen=True)
class LayerMemoryStats:
    """Figures over the attributed calls of one layer. Bytes are ints.

    ``peak_increase`` and ``peak_allocated`` and ``retained`` are maxima over calls;
    ``duration_ms`` is the total time of the attributed calls (``calls`` divides it).
    Allocation counts are exact where the counter counts (the CPU tensor ledger, CUDA's
    allocator) and 0 where it cannot.
    """
    layer_name: str
    calls: int
    peak_allocated: int
    peak_increase: int
    retained: int
    peak_reserved: int
    avg_fragmentation: float | None  # None where not measured (CPU: no per-layer heap view)
    total_allocations: int
    total_deallocations: int
    duration_ms: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class _Acc:
    __slots__ = ("calls", "peak_allocated", "peak_increase", "retained", "peak_reserved",
                 "frag_sum", "frag_n", "allocs", "frees", "duration_s")

    def __init__(self) -> None:
        self.calls = 0
        self.peak_allocated = 0
        self.peak_increase = 0
        self.retained: int | None = None
        self.peak_reserved = 0
        self.frag_sum = 0.0
        self.frag_n = 0
        self.allocs = 0
        self.frees = 0
        self.duration_s = 0.0


class LayerAccumulator:
    """Thread-safe fold of calls into per-layer stats; ``merge`` takes a whole forward at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._acc: dict[str, _Acc] = {}

    def merge(self, calls: Iterable[LayerCall], *, baseline: int = 0) -> None:
        """``baseline`` is added to levels to make them absolute (the CPU ledger counts from 0)."""
        with self._lock:
            for c in calls:
                a = self._acc.get(c.path)
                if a is None:
                    a = self._acc[c.path] = _Acc()
                a.calls += 1
                a.peak_allocated = max(a.peak_allocated, c.peak_level + baseline)
                a.peak_increase = max(a.peak_increase, c.peak_increase)
                a.retained = c.retained if a.retained is None else max(a.retained, c.retained)
                a.peak_reserved = max(a.peak_reserved, c.reserved_peak + baseline)
                if c.fragmentation is not None:
                    a.frag_sum += c.fragmentation
                    a.frag_n += 1
                a.allocs += c.allocations
                a.frees += c.frees
                a.duration_s += c.duration_s

    def snapshot(self) -> dict[str, LayerMemoryStats]:
        with self._lock:
            return {path: LayerMemoryStats(
                layer_name=path, calls=a.calls, peak_allocated=a.peak_allocated,
                peak_increase=a.peak_increase, retained=a.retained or 0, peak_reserved=a.peak_reserved,
                avg_fragmentation=a.frag_sum / a.frag_n if a.frag_n else None,
                total_allocations=a.allocs, total_deallocations=a.frees,
                duration_ms=a.duration_s * 1000.0) for path, a in self._acc.items()}

    def forward_totals(self) -> dict[str, tuple[float, int]]:
        """Path -> (seconds, calls), without building a LayerMemoryStats per layer (scrape path)."""
        with self._lock:
            return {path: (a.duration_s, a.calls) for path, a in self._acc.items()}

    def clear(self) -> None:
        with self._lock:
            self._acc.clear()
