"""What a pod of a fleet serves on /metrics: the figures the shipped alerts, dashboards and fleet
recording rules read, with coarser operation histograms. Pure.

A process in ``top`` mode (series.layers, the default in a Kubernetes pod) is one of many replicas
scraped by one Prometheus, so every series it serves is multiplied by the fleet. Per-layer series
are already cut to the top layers there; what else a GPU pod with one operation name served was
~150 series, two thirds of them the same in every pod of the deployment or read by nothing the
project ships. ``series.families: auto`` (the default) therefore serves the *fleet* set wherever
per-layer series are ``top``, and everything elsewhere (a laptop, the demo, compose, and the
``series.full_detail_fraction`` of a fleet's pods that export every layer):

- the operation histograms with a subset of their bounds (``FLEET_*_BUCKETS``): a bucket's count
  at a kept bound is exact, quantiles are coarser; the per-operation memory peak increase (the
  operation's own need, next to its level at the peak, which stays) is left out;
- the families in ``LEFT_OUT``: detail of the allocator, the process and the exporter that no
  shipped alert, dashboard panel or recording rule reads (tests/assets checks that).

``series.families: all`` serves everything in top mode too, with the full buckets.
"""
from __future__ import annotations

from collections.abc import Mapping

from ..metric_names import (DURATION_BUCKETS, FLEET_DURATION_BUCKETS, FLEET_MEMORY_PEAK_BUCKETS,
                            MEMORY_PEAK_BUCKETS)

ALL, FLEET, AUTO = "all", "fleet", "auto"

LEFT_OUT: frozenset[str] = frozenset({
    # the operation's own peak need; its level at the peak (memory_peak) and last delta stay
    "memprof_operation_memory_peak_increase_bytes",
    # allocator detail: allocated, reserved, the fragmentation ratio, retries and OOMs stay
    "memprof_allocator_active_bytes", "memprof_allocator_inactive_split_bytes",
    "memprof_allocator_cache_free_ratio", "memprof_allocator_allocated_peak_bytes",
    "memprof_allocator_reserved_peak_bytes",
    # process and container detail: resident memory and its peak, CPU, the working set stay
    "memprof_process_virtual_memory_bytes", "memprof_process_children_resident_memory_bytes",
    "memprof_process_io_read_bytes_total", "memprof_process_io_write_bytes_total",
    "memprof_container_memory_usage_bytes",
    # the kernel's early warnings of an OOM kill: MemprofContainerMemoryFullSoon reads the working
    # set and the limit; in Kubernetes the kubelet's cAdvisor exports the container's PSI and failcnt
    "memprof_memory_pressure_stall_seconds_total", "memprof_container_memory_events_total",
    # the exporter's own detail: its errors, sources and sampler health stay
    "memprof_http_connection_errors_total", "memprof_events_dropped_total",
    "memprof_forwards_unattributed_total", "memprof_dumps_total",
})

# counters whose samples at 0 the fleet set leaves out: they are counted once, at start, before any
# scrape (so a 0 never shows an increase()), and their alert also fires on a series that appears
# above 0; a pod where nothing happened pays no series for them
ZEROS_LEFT_OUT: frozenset[str] = frozenset({"memprof_postmortems_total"})

# histogram family -> (its full bounds, the fleet's)
FLEET_BUCKETS: Mapping[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "memprof_operation_duration_seconds": (DURATION_BUCKETS, FLEET_DURATION_BUCKETS),
    "memprof_operation_memory_peak_bytes": (MEMORY_PEAK_BUCKETS, FLEET_MEMORY_PEAK_BUCKETS),
}


def serves_fleet_set(families: str, every_layer: bool) -> bool:
    """Does this process serve the fleet set? ``families`` all/fleet/auto (series.families);
    ``every_layer``: whether it exports every layer's series (series.layers)."""
    if families == AUTO:
        return not every_layer
    return families == FLEET


__all__ = ["ALL", "AUTO", "FLEET", "FLEET_BUCKETS", "LEFT_OUT", "ZEROS_LEFT_OUT", "serves_fleet_set"]
