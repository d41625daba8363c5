"""The latest figures as labelled series, keyed by Prometheus name: the one data path that the
Prometheus collector, the OTel callbacks and the watchdog all read.

Pure over its inputs (a ``Sample``, sampler health, instrumentation views, counters); never reads
a device, so building it at scrape time cannot trigger a CUDA sync.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ..attribution.selection import OTHER
from ..capacity.memory_budget import CapacityFigures
from ..timeline import Sample
from .gpu_identity import identify

Labels = dict[str, str]
Series = dict[str, list[tuple[Labels, float]]]

# allocator figure key (cuda_stats / glibc) -> metric name
_ALLOCATOR = {
    "allocated_bytes": "memprof_allocator_allocated_bytes",
    "reserved_bytes": "memprof_allocator_reserved_bytes",
    "active_bytes": "memprof_allocator_active_bytes",
    "inactive_split_bytes": "memprof_allocator_inactive_split_bytes",
    "allocated_peak_bytes": "memprof_allocator_allocated_peak_bytes",
    "reserved_peak_bytes": "memprof_allocator_reserved_peak_bytes",
    "fragmentation_ratio": "memprof_allocator_fragmentation_ratio",
    "cache_free_ratio": "memprof_allocator_cache_free_ratio",
    "alloc_retries": "memprof_allocator_alloc_retries_total",
    "ooms": "memprof_allocator_ooms_total",
}
_PROCESS = {
    "resident_memory_bytes": "memprof_process_resident_memory_bytes",
    "virtual_memory_bytes": "memprof_process_virtual_memory_bytes",
    "peak_resident_memory_bytes": "memprof_process_peak_resident_memory_bytes",
    "memory_limit_bytes": "memprof_process_memory_limit_bytes",
    "children_resident_memory_bytes": "memprof_process_children_resident_memory_bytes",
    "cpu_seconds": "memprof_process_cpu_seconds_total",
    "cpu_utilization_ratio": "memprof_process_cpu_utilization_ratio",
    "io_read_bytes": "memprof_process_io_read_bytes_total",
    "io_write_bytes": "memprof_process_io_write_bytes_total",
}

# CgroupSource.stats() key -> metric name
_CONTAINER = {
    "memory_usage_bytes": "memprof_container_memory_usage_bytes",
    "memory_working_set_bytes": "memprof_container_memory_working_set_bytes",
    "oom_kills": "memprof_container_oom_kills_total",
    "cpu_limit_cores": "memprof_container_cpu_limit_cores",
}
# CgroupSource.stats() key -> (metric name, labels): the early warnings of an OOM kill. The PSI
# totals' scope is where the kernel keeps them for this process (the cgroup on v2, else the system).
_CONTAINER_LABELLED: dict[str, tuple[str, Labels]] = {
    **{f"memory_pressure_{scope}_{kind}_seconds": ("memprof_memory_pressure_stall_seconds_total",
                                                   {"kind": kind, "scope": scope})
       for scope in ("cgroup", "system") for kind in ("some", "full")},
    **{f"memory_events_{event}": ("memprof_container_memory_events_total", {"event": event})
       for event in ("high", "max")},
}


# the frameworks memprof_build_info names the version of (``<name>_version``; empty when not in use)
FRAMEWORKS = ("torch", "keras", "tensorflow", "jax")

UNATTRIBUTED_REASONS = ("concurrent", "trace_lost")  # memprof_forwards_unattributed_total's reasons


@dataclass
class LayerView:
    """What series needs from one instrumented model (read through ``Instrumentation``)."""
    model: str
    device: str
    peaks: Mapping[str, Any]                  # path -> WindowFigures
    forward: Mapping[str, tuple[float, int]]  # path -> (seconds total, calls)
    overhead_seconds: float
    events_dropped: int
    # (layer, device) -> bytes of storages born there in attributed forwards, still alive
    surviving: Mapping[tuple[str, str], int] = field(default_factory=dict)
    # reason -> attributed forwards whose per-layer figures were dropped (never published wrong)
    unattributed: Mapping[str, int] = field(default_factory=dict)
    capacity: CapacityFigures | None = None  # the memory model's figures (None: capacity off)


@dataclass
class SelfView:
    sources_up: Mapping[str, bool] = field(default_factory=dict)
    sampler_errors: Mapping[str, int] = field(default_factory=dict)
    sampler_duration_s: float | None = None
    sampler_last_success: float | None = None
    export_errors: Mapping[str, int] = field(default_factory=dict)
    dumps: Mapping[tuple[str, str], int] = field(default_factory=dict)
    extra_ooms: Mapping[str, int] = field(default_factory=dict)  # device -> OOMs seen in forwards
    config_errors: Mapping[str, int] = field(default_factory=dict)  # source -> values ignored
    http_connection_errors: Mapping[str, int] = field(default_factory=dict)  # reason -> failed connections
    cuda_uuids: Mapping[int, str] = field(default_factory=dict)  # CUDA index -> torch's device UUID
    version: str = ""
    # framework -> its version, for the frameworks this process has imported (FRAMEWORKS)
    frameworks: Mapping[str, str] = field(default_factory=dict)

    @property
    def torch_version(self) -> str:
        return self.frameworks.get("torch", "")
    service_version: str = ""  # the deployment's service.version: before/after a deploy


def build_series(sample: Sample | None, layers: Iterable[LayerView], me: SelfView,
                 per_layer: bool = True) -> Series:
    """``per_layer=False`` leaves out the per-layer gauges (the scrape writes those itself)."""
    out: Series = {}

    def add(name: str, labels: Labels, value: float) -> None:
        out.setdefault(name, []).append((labels, float(value)))

    if sample is not None:
        for key, name in _PROCESS.items():
            if key in sample.process:
                add(name, {}, sample.process[key])
        for key, name in _CONTAINER.items():
            if key in sample.container:  # no cgroup, no limit: absent, never a fake 0
                add(name, {}, sample.container[key])
        for key, (name, labels) in _CONTAINER_LABELLED.items():
            if key in sample.container:  # no PSI, no memory.events: absent
                add(name, dict(labels), sample.container[key])
        for device, figures in sorted(sample.allocators.items()):
            for key, name in _ALLOCATOR.items():
                if key in figures:
                    v = figures[key] + (me.extra_ooms.get(device, 0) if key == "ooms" else 0)
                    add(name, {"device": device}, v)
        for g in sample.gpus:
            lab = {"gpu": str(g.index), "gpu_uuid": g.uuid}
            add("memprof_gpu_memory_used_bytes", lab, g.used_bytes)
            add("memprof_gpu_memory_total_bytes", lab, g.total_bytes)
            if g.process_used_bytes is not None:
                add("memprof_gpu_process_memory_used_bytes", lab, g.process_used_bytes)
            add("memprof_gpu_info", {**lab, "gpu_model": g.model, "driver_version": g.driver_version}, 1)
            for m in g.migs:
                mlab = {**lab, "mig_uuid": m.uuid, "gpu_instance_id": str(m.gpu_instance_id),
                        "compute_instance_id": str(m.compute_instance_id)}
                add("memprof_gpu_mig_memory_used_bytes", mlab, m.used_bytes)
                add("memprof_gpu_mig_memory_total_bytes", mlab, m.total_bytes)
    _cuda_identity(add, sample, me)
    for devices_oom in me.extra_ooms.items():  # OOMs on a device the sampler has no figures for
        device, n = devices_oom
        if sample is None or device not in sample.allocators:
            add("memprof_allocator_ooms_total", {"device": device}, n)
    for v in layers:
        for path, f in sorted(v.peaks.items()) if per_layer else ():
            lab = {"model": v.model, "layer": path, "device": v.device}
            add("memprof_layer_peak_increase_bytes", lab, f.peak_increase)
            add("memprof_layer_peak_allocated_bytes", lab, f.peak_allocated)
            add("memprof_layer_retained_bytes", lab, f.retained)
            if f.fragmentation is not None:  # measured on CUDA only: absent, never a fake 0
                add("memprof_layer_fragmentation_ratio", lab, f.fragmentation)
        # not a fast-writer family (one series per layer that ever kept a storage, not per layer):
        # written whatever ``per_layer`` says
        for (path, device), n in sorted(v.surviving.items()):
            add("memprof_layer_surviving_bytes", {"model": v.model, "layer": path, "device": device}, n)
        add("memprof_overhead_seconds_total", {"model": v.model}, v.overhead_seconds)
        add("memprof_events_dropped_total", {"model": v.model}, v.events_dropped)
        # every reason from the start, at 0: rate() and alerts see the series before the first drop
        for reason in UNATTRIBUTED_REASONS:
            add("memprof_forwards_unattributed_total", {"model": v.model, "reason": reason},
                v.unattributed.get(reason, 0))
    _capacity(add, layers)
    for name, up in sorted(me.sources_up.items()):
        add("memprof_source_up", {"source": name}, 1 if up else 0)
    for name, n in sorted(me.sampler_errors.items()):
        add("memprof_sampler_errors_total", {"source": name}, n)
    if me.sampler_duration_s is not None:
        add("memprof_sampler_duration_seconds", {}, me.sampler_duration_s)
    if me.sampler_last_success:
        add("memprof_sampler_last_success_timestamp_seconds", {}, me.sampler_last_success)
    for name, n in sorted(me.export_errors.items()):
        add("memprof_export_errors_total", {"exporter": name}, n)
    for name, n in sorted(me.config_errors.items()):
        add("memprof_config_errors_total", {"source": name}, n)
    for reason, n in sorted(me.http_connection_errors.items()):
        add("memprof_http_connection_errors_total", {"reason": reason}, n)
    for (fmt, result), n in sorted(me.dumps.items()):
        add("memprof_dumps_total", {"format": fmt, "result": result}, n)
    add("memprof_build_info", {"version": me.version,
                               **{f"{name}_version": me.frameworks.get(name, "") for name in FRAMEWORKS},
                               "service_version": me.service_version}, 1)
    return out


def _capacity(add: Any, layers: Iterable[LayerView]) -> None:
    """The memory model's gauges; each absent (never a fake 0) until the model can answer it."""
    usable: dict[tuple[str, str], int] = {}
    for v in layers:
        c = v.capacity
        if c is None:
            continue
        lab = {"model": v.model, "device": c.device}
        for name, value in (("memprof_capacity_predicted_peak_bytes", c.predicted_peak),
                            ("memprof_capacity_measured_peak_bytes", c.measured_peak),
                            ("memprof_capacity_headroom_bytes", c.headroom),
                            ("memprof_capacity_fit_error_ratio", c.fit_error)):
            if value is not None:
                add(name, lab, value)
        add("memprof_capacity_model_ready", lab, 1 if c.ready else 0)  # always: 0 is the alertable state
        for seq_len, n in sorted(c.max_safe_batch.items()):
            add("memprof_capacity_max_safe_batch", {**lab, "seq_len": str(seq_len)}, n)
        if c.budget is not None:  # one per device, however many models run on it
            usable[(c.budget.device, c.budget.limit)] = c.budget.usable_bytes
    for (device, limit), n in sorted(usable.items()):
        add("memprof_capacity_usable_bytes", {"device": device, "limit": limit}, n)


def _cuda_identity(add: Any, sample: Sample | None, me: SelfView) -> None:
    """``memprof_cuda_device_info`` (torch device -> GPU identity, in our label names and in
    dcgm-exporter's) and, per GPU, torch's reserved bytes on it: the stand-in for this process's
    NVML figure where NVML cannot see our PID (a container)."""
    if not me.cuda_uuids:
        return
    gpus = sample.gpus if sample is not None else ()
    reserved: dict[tuple[str, str], float] = {}
    for ident in identify(me.cuda_uuids, gpus):
        add("memprof_cuda_device_info", {
            "device": ident.device, "gpu": ident.gpu, "gpu_uuid": ident.gpu_uuid, "UUID": ident.gpu_uuid,
            "mig_uuid": ident.mig_uuid, "GPU_I_ID": ident.gpu_instance_id}, 1)
        figures = sample.allocators.get(ident.device) if sample is not None else None
        if ident.matched and figures is not None and "reserved_bytes" in figures:
            key = (ident.gpu, ident.gpu_uuid)
            reserved[key] = reserved.get(key, 0.0) + figures["reserved_bytes"]
    for (gpu, uuid), v in sorted(reserved.items()):
        add("memprof_gpu_process_torch_reserved_bytes", {"gpu": gpu, "gpu_uuid": uuid}, v)


def layer_forward_series(layers: Iterable[LayerView]) -> list[tuple[Labels, float, int]]:
    """(labels, seconds total, calls) for the memprof_layer_forward_seconds summary."""
    return [({"model": v.model, "layer": path, "device": v.device}, s, n)
            for v in layers for path, (s, n) in sorted(v.forward.items())]


__all__ = ["LayerView", "OTHER", "SelfView", "Series", "build_series", "layer_forward_series"]
