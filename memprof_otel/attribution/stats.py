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
    allocator) and 0 where it cannot. ``surviving_bytes`` is a level, now: bytes of storages born
    in the layer during attributed forwards that are still alive (0 where the tensor ledger does
    not run, e.g. plain CUDA attribution; see docs/reference.md, "Leaks").
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
    surviving_bytes: int = 0

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
        # unpacked, compared by hand: this runs for every call of every attributed forward
        with self._lock:
            acc = self._acc
            for path, entry, peak, exit_level, allocs, frees, dur, frag, _raised, rpeak in calls:
                a = acc.get(path)
                if a is None:
                    a = acc[path] = _Acc()
                a.calls += 1
                level = peak + baseline
                if level > a.peak_allocated:
                    a.peak_allocated = level
                inc = peak - entry
                if inc > a.peak_increase:
                    a.peak_increase = inc
                ret = exit_level - entry
                if a.retained is None or ret > a.retained:
                    a.retained = ret
                rlevel = rpeak + baseline
                if rlevel > a.peak_reserved:
                    a.peak_reserved = rlevel
                if frag is not None:
                    a.frag_sum += frag
                    a.frag_n += 1
                a.allocs += allocs
                a.frees += frees
                a.duration_s += dur

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
