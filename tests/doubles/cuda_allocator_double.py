"""ScriptedCudaAllocatorDouble: a test double, not a real allocator.

It replays the bookkeeping of torch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp)
closely enough to emit the real nested stats layout of ``torch._C._cuda_memoryStats``, so unit
tests can drive ``CudaAllocatorSource`` on a machine without a GPU. Modelled: 512 B rounding,
small (<= 1 MiB) and large pools, 2 MiB small segments, 20 MiB segments for 1-10 MiB requests,
2 MiB-rounded segments above, best-fit reuse, splitting and merging of blocks, inactive-split
accounting, ``empty_cache``, and the free-cache-and-retry path before an OOM. Not modelled:
streams, events, graphs, expandable segments, ``max_split_size``, private pools.
"""
from __future__ import annotations

import collections
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

KIB = 1024
MIB = 1024 * KIB
MIN_BLOCK = 512            # kMinBlockSize: every block is a multiple of this
SMALL_SIZE = 1 * MIB       # kSmallSize: requests up to this go to the small pool
SMALL_BUFFER = 2 * MIB     # kSmallBuffer: segment size of the small pool
LARGE_BUFFER = 20 * MIB    # kLargeBuffer: segment for requests between 1 and 10 MiB
MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc: at and above this, segments are rounded...
ROUND_LARGE = 2 * MIB      # kRoundLarge: ...up to a multiple of this

_POOLS = ("all", "small_pool", "large_pool")
_STAT_ARRAYS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
                "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes")


def format_size(size: int) -> str:
    """c10's ``format_size``: two decimals of KiB, MiB or GiB (bytes up to 1 KiB)."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1048576:
        return f"{size / 1024.0:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576.0:.2f} MiB"
    return f"{size / 1073741824.0:.2f} GiB"


def round_size(nbytes: int) -> int:
    """Block size the real allocator hands out for an ``nbytes`` request."""
    return MIN_BLOCK if nbytes < MIN_BLOCK else -(-nbytes // MIN_BLOCK) * MIN_BLOCK


def segment_size(block_size: int) -> int:
    """Size of the cudaMalloc the real allocator makes when no cached block fits."""
    if block_size <= SMALL_SIZE:
        return SMALL_BUFFER
    if block_size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-block_size // ROUND_LARGE) * ROUND_LARGE


@dataclass
class _Stat:
    current: int = 0
    peak: int = 0
    allocated: int = 0
    freed: int = 0

    def change(self, amount: int) -> None:
        if amount >= 0:
            self.current += amount
            self.allocated += amount
            self.peak = max(self.peak, self.current)
        else:
            self.current += amount
            self.freed -= amount

    def as_dict(self) -> dict[str, int]:
        return {"current": self.current, "peak": self.peak,
                "allocated": self.allocated, "freed": self.freed}


@dataclass(eq=False)
class _Block:
    offset: int
    size: int
    requested: int = 0
    allocated: bool = False


@dataclass(eq=False)
class _Segment:
    pool: str
    size: int
    blocks: list[_Block] = field(default_factory=list)  # sorted by offset, contiguous


class ScriptedCudaAllocatorDouble:
    """A test double, not a real allocator: scripted ``malloc``/``free`` produce real-shaped stats.

    Pass ``memory_stats_nested`` as ``stats_fn`` and ``reset_peak`` as ``reset_peak_fn`` to
    ``CudaAllocatorSource``. ``capacity_bytes`` is the device size: a segment that would push
    reserved memory past it first releases the cache and retries (``num_alloc_retries``), then
    raises ``torch.OutOfMemoryError`` (``num_ooms``), as the real allocator does.
    """

    def __init__(self, device_index: int = 0, *, capacity_bytes: int = 16 * 1024 * MIB) -> None:
        self.device_index = device_index
        self.capacity_bytes = capacity_bytes
        self._segments: list[_Segment] = []
        self._live: dict[int, tuple[_Segment, _Block]] = {}
        self._handles = itertools.count(1)
        self._arrays = {name: {pool: _Stat() for pool in _POOLS} for name in _STAT_ARRAYS}
        self._counters = {"num_alloc_retries": 0, "num_ooms": 0, "num_device_alloc": 0,
                          "num_device_free": 0}
        self.reset_peak_calls = 0
        # allocator history, as torch.cuda.memory._record_memory_history keeps it: the last
        # max_entries events while enabled; record_calls logs every on/off call
        self._trace: collections.deque[dict[str, Any]] | None = None
        self.record_calls: list[dict[str, Any]] = []
        # torch's user metadata is per thread (seen on torch 2.11 + an H100: a thread does not see
        # the string another thread set); every event carries the recording thread's
        self._metadata = threading.local()
        self.snapshot_calls = 0

    # -- scripting -------------------------------------------------------------------------
    def malloc(self, nbytes: int) -> int:
        """Allocate ``nbytes``; returns a handle for ``free``."""
        if nbytes <= 0:
            raise ValueError(f"nbytes must be > 0, not {nbytes}")
        size = round_size(nbytes)
        pool = "small_pool" if size <= SMALL_SIZE else "large_pool"
        found = self._best_fit(pool, size)
        if found is None:
            found = self._new_segment(pool, segment_size(size), nbytes)
        segment, block = found
        remaining = block.size - size
        # Small blocks split down to any 512 B rest; large ones only if the rest is > 1 MiB.
        worth_splitting = remaining >= MIN_BLOCK if pool == "small_pool" else remaining > SMALL_SIZE
        if worth_splitting:
            tail = _Block(offset=block.offset + size, size=remaining)
            segment.blocks.insert(segment.blocks.index(block) + 1, tail)
            block.size = size
        block.allocated, block.requested = True, nbytes
        self._count(pool, "allocation", 1)
        self._count(pool, "active", 1)
        for name in ("allocated_bytes", "active_bytes"):
            self._count(pool, name, block.size)
        self._count(pool, "requested_bytes", nbytes)
        self._refresh_inactive_split()
        handle = next(self._handles)
        self._live[handle] = (segment, block)
        self._trace_event("alloc", segment, block, nbytes)
        return handle

    def free(self, handle: int) -> None:
        """Return a block to the cache, merging it with free neighbours."""
        segment, block = self._live.pop(handle)
        # torch records both: the stats drop at the request, the pool gets the block at completion
        # (later when other streams still use it; the double has one stream, so at once)
        self._trace_event("free_requested", segment, block, block.requested)
        self._trace_event("free_completed", segment, block, block.requested)
        self._count(segment.pool, "allocation", -1)
        self._count(segment.pool, "active", -1)
        for name in ("allocated_bytes", "active_bytes"):
            self._count(segment.pool, name, -block.size)
        self._count(segment.pool, "requested_bytes", -block.requested)
        block.allocated, block.requested = False, 0
        merged: list[_Block] = []
        for b in segment.blocks:
            if merged and not b.allocated and not merged[-1].allocated:
                merged[-1].size += b.size
            else:
                merged.append(b)
        segment.blocks = merged
        self._refresh_inactive_split()

    def empty_cache(self) -> None:
        """Release every segment that holds no live block (cudaFree)."""
        for segment in [s for s in self._segments if len(s.blocks) == 1 and not s.blocks[0].allocated]:
            self._segments.remove(segment)
            self._trace_event("segment_free", segment, None, segment.size)
            self._count(segment.pool, "segment", -1)
            self._count(segment.pool, "reserved_bytes", -segment.size)
            self._counters["num_device_free"] += 1

    # -- allocator history: stand-ins for torch.cuda.memory._record_memory_history / _snapshot --
    def _trace_event(self, action: str, segment: _Segment, block: _Block | None, nbytes: int) -> None:
        if self._trace is not None:
            self._trace.append({"action": action, "addr": id(segment) * 4096 + (block.offset if block else 0),
                                # torch records the request (orig_size), not the block it got
                                "size": nbytes if block else segment.size, "requested_size": nbytes,
                                "stream": 0, "frames": [], "time_us": time.time_ns() // 1000,
                                "user_metadata": getattr(self._metadata, "value", "")})

    def record_memory_history(self, enabled: str | None = "all", context: str | None = "all",
                              stacks: str = "all", max_entries: int = 2**63 - 1, device: Any = None,
                              clear_history: bool = False, **_: Any) -> None:
        self.record_calls.append({"enabled": enabled, "max_entries": max_entries, "device": device,
                                  "context": context, "clear_history": clear_history})
        if enabled is None:
            self._trace = None
        elif self._trace is None or clear_history or self._trace.maxlen != max_entries:
            kept = [] if self._trace is None or clear_history else list(self._trace)
            self._trace = collections.deque(kept, maxlen=max_entries)

    def set_metadata(self, value: str) -> None:
        """Like ``torch._C._cuda_setMemoryMetadata``: this thread's string for its next events."""
        self._metadata.value = value

    def trace_fns(self) -> Any:
        """The calls ``CudaAllocatorTrace`` takes, backed by this double."""
        from memprof_otel.sources.cuda_trace import TraceFns

        def snapshot() -> dict[str, Any]:
            self.snapshot_calls += 1
            return self.snapshot()

        return TraceFns(arm=lambda n, clear: self.record_memory_history("all", None, max_entries=n, clear_history=clear),
                        disarm=lambda: self.record_memory_history(None), snapshot=snapshot,
                        set_metadata=self.set_metadata, is_enabled=lambda: self.recording)

    def snapshot(self, device: Any = None, **_: Any) -> dict[str, Any]:
        traces = list(self._trace) if self._trace is not None else []
        return {"segments": [{"device": self.device_index, "address": id(s) * 4096, "total_size": s.size,
                              "segment_type": "small" if s.pool == "small_pool" else "large",
                              "blocks": [{"size": b.size, "state": "active_allocated" if b.allocated else
                                          "inactive"} for b in s.blocks]} for s in self._segments],
                "device_traces": [traces]}

    @property
    def recording(self) -> bool:
        return self._trace is not None

    # -- the two functions CudaAllocatorSource takes -----------------------------------------
    def memory_stats_nested(self, device_index: int) -> dict[str, Any]:
        """Same shape as ``torch._C._cuda_memoryStats(device_index)``."""
        self._check_device(device_index)
        out: dict[str, Any] = dict(self._counters)
        out["num_sync_all_streams"] = 0
        out["num_oom_rejections"] = 0
        out["max_split_size"] = -1  # real builds report SIZE_MAX cast to int64 when unset
        for name, per_pool in self._arrays.items():
            out[name] = {pool: stat.as_dict() for pool, stat in per_pool.items()}
        out["oversize_allocations"] = _Stat().as_dict()
        out["oversize_segments"] = _Stat().as_dict()
        return out

    def reset_peak(self, device_index: int) -> None:
        """Like ``torch._C._cuda_resetPeakMemoryStats``: every peak becomes its current value."""
        self._check_device(device_index)
        self.reset_peak_calls += 1
        for per_pool in self._arrays.values():
            for stat in per_pool.values():
                stat.peak = stat.current

    # -- internals ---------------------------------------------------------------------------
    def _check_device(self, device_index: int) -> None:
        if device_index != self.device_index:
            raise RuntimeError(f"Invalid device argument {device_index}: this double is "
                               f"device {self.device_index}")

    def _count(self, pool: str, name: str, amount: int) -> None:
        self._arrays[name]["all"].change(amount)
        self._arrays[name][pool].change(amount)

    def _best_fit(self, pool: str, size: int) -> tuple[_Segment, _Block] | None:
        fits = [(b.size, i, s, b) for i, s in enumerate(self._segments) if s.pool == pool
                for b in s.blocks if not b.allocated and b.size >= size]
        if not fits:
            return None
        _, _, segment, block = min(fits, key=lambda t: (t[0], t[1], t[3].offset))
        return segment, block

    def _reserved(self) -> int:
        return sum(s.size for s in self._segments)

    def _new_segment(self, pool: str, size: int, nbytes: int) -> tuple[_Segment, _Block]:
        if self._reserved() + size > self.capacity_bytes:
            # The real allocator frees cached (unsplit) segments and retries the cudaMalloc.
            self.empty_cache()
            self._counters["num_alloc_retries"] += 1
            if self._reserved() + size > self.capacity_bytes:
                self._counters["num_ooms"] += 1
                raise torch.OutOfMemoryError(self.oom_message(size))
        segment = _Segment(pool=pool, size=size, blocks=[_Block(offset=0, size=size)])
        self._segments.append(segment)
        self._trace_event("segment_alloc", segment, None, size)
        self._count(pool, "segment", 1)
        self._count(pool, "reserved_bytes", size)
        self._counters["num_device_alloc"] += 1
        return segment, segment.blocks[0]

    def oom_message(self, segment: int) -> str:
        """torch's message (c10/cuda/CUDACachingAllocator.cpp, torch 2.1 and later) for a failed
        ``segment``-sized cudaMalloc, with the device's total taken as ``capacity_bytes``."""
        reserved = self._reserved()
        allocated = self._arrays["allocated_bytes"]["all"].current
        return (f"CUDA out of memory. Tried to allocate {format_size(segment)}. GPU {self.device_index} has a total "
                f"capacity of {format_size(self.capacity_bytes)} of which "
                f"{format_size(self.capacity_bytes - reserved)} is free. Of the allocated memory "
                f"{format_size(allocated)} is allocated by PyTorch, and {format_size(reserved - allocated)} is "
                "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
                "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")

    def _refresh_inactive_split(self) -> None:
        # A free block is "inactive split" while its segment also holds other blocks: it cannot
        # be released by empty_cache(). Recomputing and applying the delta keeps current exact.
        for pool in ("small_pool", "large_pool"):
            free = [b for s in self._segments if s.pool == pool and len(s.blocks) > 1
                    for b in s.blocks if not b.allocated]
            self._count(pool, "inactive_split",
                        len(free) - self._arrays["inactive_split"][pool].current)
            self._count(pool, "inactive_split_bytes", sum(b.size for b in free)
                        - self._arrays["inactive_split_bytes"][pool].current)
