"""Pure figures over torch's CUDA caching-allocator stats (no torch import).

Input is the *nested* dict of ``torch._C._cuda_memoryStats(device)``, i.e. what
``torch.cuda.memory_stats_as_nested_dict`` returns, not the flattened ``memory_stats`` form:
flattening and sorting the whole dict costs ~165 us, far too much for a per-layer hook.

Layout (from ``torch/csrc/cuda/Module.cpp``; the ``memory_stats`` docstring calls the count stat
``allocated`` but the real key is ``allocation``)::

    {"allocated_bytes" | "reserved_bytes" | "active_bytes" | "inactive_split_bytes"
     | "requested_bytes" | "allocation" | "segment" | "active" | "inactive_split":
         {"all" | "small_pool" | "large_pool": {"current", "peak", "allocated", "freed"}},
     "oversize_allocations" | "oversize_segments": {"current", "peak", "allocated", "freed"},
     "num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
     "num_device_free", "max_split_size", ...: int}

Missing keys read as 0 (older torch, ``cudaMallocAsync`` backend, CUDA not initialised yet give
partial or empty dicts). A present value that is not a finite non-negative number raises
``ValueError``: that is a broken backend, and the caller counts it rather than export nonsense.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from memprof_otel.sources.base import Reading, ratio

__all__ = ["FIGURE_KEYS", "figures", "nested_from_flat", "reading", "stat"]

FIGURE_KEYS: tuple[str, ...] = (
    "allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes",
    "allocated_peak_bytes", "reserved_peak_bytes", "alloc_retries", "ooms",
    "allocations", "frees", "fragmentation_ratio", "cache_free_ratio",
)

_MISSING = object()


def stat(nested: Mapping[str, Any], *path: str) -> int | float:
    """The number at ``path`` (e.g. ``"allocated_bytes", "all", "current"``); 0 when absent.

    Raises ValueError when the root or an inner node is not a mapping, or the leaf is not a
    finite number >= 0 (bools are rejected: ``True`` is not a byte count).
    """
    node: Any = nested
    for depth, key in enumerate(path):
        if not isinstance(node, Mapping):
            where = ".".join(path[:depth]) or "<root>"
            raise ValueError(f"allocator stats: {where} is {type(node).__name__}, not a dict")
        node = node.get(key, _MISSING)
        if node is _MISSING:
            return 0
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        raise ValueError(f"allocator stats: {'.'.join(path)} is not a number: {node!r}")
    if not math.isfinite(node) or node < 0:
        raise ValueError(f"allocator stats: {'.'.join(path)} is not a finite count >= 0: {node!r}")
    return node


def nested_from_flat(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The nested layout from ``torch.cuda.memory_stats``'s flat one (``"allocated_bytes.all.peak"``
    -> ``{"allocated_bytes": {"all": {"peak": ...}}}``): the fallback when a torch lacks the raw call."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *inner, leaf = str(key).split(".")
        node = out
        for part in inner:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"allocator stats: {key} nests under a number")
            node = child
        node[leaf] = value
    return out


def figures(nested: Mapping[str, Any]) -> dict[str, float]:
    """Every figure the sampler exports for one CUDA device (keys: ``FIGURE_KEYS``).

    ``fragmentation_ratio`` is inactive-split / reserved: free bytes stranded inside segments that
    still hold live blocks, which ``empty_cache()`` cannot return. ``cache_free_ratio`` is
    (reserved - allocated) / reserved: all cached-but-unused bytes, including whole free segments
    that *are* releasable. Both are 0 for an empty allocator.
    """
    allocated = stat(nested, "allocated_bytes", "all", "current")
    reserved = stat(nested, "reserved_bytes", "all", "current")
    inactive_split = stat(nested, "inactive_split_bytes", "all", "current")
    return {
        "allocated_bytes": allocated,
        "reserved_bytes": reserved,
        "active_bytes": stat(nested, "active_bytes", "all", "current"),
        "inactive_split_bytes": inactive_split,
        "allocated_peak_bytes": stat(nested, "allocated_bytes", "all", "peak"),
        "reserved_peak_bytes": stat(nested, "reserved_bytes", "all", "peak"),
        "alloc_retries": stat(nested, "num_alloc_retries"),
        "ooms": stat(nested, "num_ooms"),
        "allocations": stat(nested, "allocation", "all", "allocated"),
        "frees": stat(nested, "allocation", "all", "freed"),
        "fragmentation_ratio": ratio(inactive_split, reserved),
        "cache_free_ratio": ratio(reserved - allocated, reserved),
    }


def reading(nested: Mapping[str, Any]) -> Reading:
    """The hot-path subset of ``figures`` (six lookups instead of twelve)."""
    reserved = int(stat(nested, "reserved_bytes", "all", "current"))
    return Reading(
        allocated=int(stat(nested, "allocated_bytes", "all", "current")),
        reserved=reserved,
        peak=int(stat(nested, "allocated_bytes", "all", "peak")),
        allocations=int(stat(nested, "allocation", "all", "allocated")),
        frees=int(stat(nested, "allocation", "all", "freed")),
        fragmentation=ratio(stat(nested, "inactive_split_bytes", "all", "current"), reserved),
    )
