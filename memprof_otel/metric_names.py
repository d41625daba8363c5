"""Every exported metric, defined once: Prometheus name, OTel instrument name and unit, help.

Both exporters read this table, so a rename cannot drift between them, and a unit test applies the
standard OTel-to-Prometheus translation to every OTel name here and expects the Prometheus name.
"""
from __future__ import annotations

from dataclasses import dataclass

# power-of-4 buckets, 1 MiB .. 64 GiB (docs/reference.md), for operation memory peaks
MEMORY_PEAK_BUCKETS: tuple[float, ...] = tuple(float(1 << (20 + 2 * i)) for i in range(9))
DURATION_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                                       30.0, 60.0, 300.0, 1800.0)
# the same histograms as a pod of a fleet exports them on /metrics (series.families: fleet, the
# default in top mode): a subset of the bounds above, so each bucket's cumulative count is exactly
# the full histogram's at that bound. Decades from 10 ms to 10 s; powers of 4 from 256 MiB to 16 GiB
# (the level at an operation's peak: a served model's weights alone are hundreds of MiB).
FLEET_DURATION_BUCKETS: tuple[float, ...] = (0.01, 0.1, 1.0, 10.0)
FLEET_MEMORY_PEAK_BUCKETS: tuple[float, ...] = tuple(float(1 << (28 + 2 * i)) for i in range(4))
assert set(FLEET_DURATION_BUCKETS) <= set(DURATION_BUCKETS)
assert set(FLEET_MEMORY_PEAK_BUCKETS) <= set(MEMORY_PEAK_BUCKETS)
# per-layer forward times (OTel histogram memprof.layer.forward): half-decades, 10 us .. 1 s. Layer
# calls run from microseconds (an activation) to a second (a whole large model), and a quantile
# read off these buckets is within a factor ~3; 11 bounds = 12 buckets (+ sum, count) per
# (model, layer, device), against 16 for DURATION_BUCKETS, whose 5 ms floor lumps most layers
# into the first bucket. Finer buckets would multiply by attribution.max_layers.
LAYER_DURATION_BUCKETS: tuple[float, ...] = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1.0)


# UCUM unit -> the Prometheus/OpenMetrics unit word a name ends with
_PROM_UNITS = {"By": "bytes", "s": "seconds", "1": "ratio", "{cpu}": "cores"}


@dataclass(frozen=True)
class MetricDef:
    prom: str                 # the Prometheus family name as scraped (counters end in _total)
    otel: str                 # the OTel instrument name
    unit: str                 # UCUM unit of the OTel instrument ("By", "s", "1", "{retry}", "")
    kind: str                 # gauge | counter | histogram | summary | info
    help: str
    labels: tuple[str, ...] = ()

    @property
    def prom_unit(self) -> str:
        """The OpenMetrics unit (``# UNIT`` line): the name's unit suffix, where the name has one."""
        unit = _PROM_UNITS.get(self.unit, "")
        return unit if unit and self.family.endswith("_" + unit) else ""

    @property
    def family(self) -> str:
        """prometheus_client's family name: counters without ``_total``, info without ``_info``."""
        if self.kind == "counter":
            return self.prom[: -len("_total")]
        if self.kind == "info":
            return self.prom[: -len("_info")]
        return self.prom


_L = ("model", "layer", "device")
_D = ("device",)
_G = ("gpu", "gpu_uuid")
_M = ("gpu", "gpu_uuid", "mig_uuid", "gpu_instance_id", "compute_instance_id")
_R = ("rule", "severity")

METRICS: tuple[MetricDef, ...] = (
    # per layer
    MetricDef("memprof_layer_peak_increase_bytes", "memprof.layer.peak_increase", "By", "gauge",
              "Peak allocated above the level at layer entry (the layer's own transient need), "
              "max over the last completed window", _L),
    MetricDef("memprof_layer_peak_allocated_bytes", "memprof.layer.peak_allocated", "By", "gauge",
              "Absolute allocated level at the layer's peak, max over the last completed window", _L),
    MetricDef("memprof_layer_retained_bytes", "memprof.layer.retained", "By", "gauge",
              "Allocated at layer exit minus at entry, max over the last completed window", _L),
    MetricDef("memprof_layer_fragmentation_ratio", "memprof.layer.fragmentation", "1", "gauge",
              "Allocator fragmentation (inactive split / reserved) during the layer's calls", _L),
    MetricDef("memprof_layer_forward_seconds", "memprof.layer.forward", "s", "summary",
              "Time in the layer's attributed forward calls", _L),
    MetricDef("memprof_layer_surviving_bytes", "memprof.layer.surviving", "By", "gauge",
              "Bytes of storages born in the layer during attributed forwards that are still alive", _L),
    # leaks
    MetricDef("memprof_memory_growth_bytes_per_second", "memprof.memory.growth", "By/s", "gauge",
              "Theil-Sen slope of the floor (per-interval minimum) of the process RSS (source=process) "
              "or of allocated bytes (source=allocator), after warm-up", ("source", "device")),
    MetricDef("memprof_layer_growth_bytes_per_second", "memprof.layer.growth", "By/s", "gauge",
              "Theil-Sen slope of the floor of the layer's surviving bytes, after warm-up", _L),
    MetricDef("memprof_memory_leak_suspected", "memprof.memory.leak_suspected", "", "gauge",
              "1 while the growth of the process RSS (source=process) or of allocated bytes "
              "(source=allocator) is significant, else 0", ("source", "device")),
    MetricDef("memprof_layer_leak_suspected", "memprof.layer.leak_suspected", "", "gauge",
              "1 while the growth of the layer's surviving bytes is significant, else 0", _L),
    # capacity: the memory model of each instrumented model (docs/capacity.md)
    MetricDef("memprof_capacity_predicted_peak_bytes", "memprof.capacity.predicted_peak", "By", "gauge",
              "Predicted peak increase of one forward (bytes above the level at its entry) for the largest "
              "input shape seen in the last capacity.recent_window", ("model", "device")),
    MetricDef("memprof_capacity_measured_peak_bytes", "memprof.capacity.measured_peak", "By", "gauge",
              "Measured peak increase (median of the attributed forwards) of that same largest recent shape",
              ("model", "device")),
    MetricDef("memprof_capacity_headroom_bytes", "memprof.capacity.headroom", "By", "gauge",
              "Bytes left under the limit once the largest recent shape's predicted peak, its fit error, "
              "what is in use now and the margin are taken off; below 0 it would not fit now",
              ("model", "device")),
    MetricDef("memprof_capacity_max_safe_batch", "memprof.capacity.max_safe_batch", "{sequence}", "gauge",
              "Largest batch predicted to fit now at this sequence length (0: not even one); past "
              "capacity.max_extrapolation times the shapes seen, the largest batch within it (known to fit)",
              ("model", "device", "seq_len")),
    MetricDef("memprof_capacity_model_ready", "memprof.capacity.model_ready", "", "gauge",
              "1 while the memory model answers (a fit whose error was measured on shapes left out, and a "
              "limit known); 0 while it cannot, when fits() returns the caller's unknown= for every shape",
              ("model", "device")),
    MetricDef("memprof_capacity_fit_error_ratio", "memprof.capacity.fit_error", "1", "gauge",
              "Worst relative error of the memory model on shapes it was not fitted on (leave-one-shape-out)",
              ("model", "device")),
    MetricDef("memprof_capacity_usable_bytes", "memprof.capacity.usable", "By", "gauge",
              "Memory the device's forwards may use: the limit named by 'limit' minus what other processes "
              "and this process's non-allocator memory hold, minus the margin", ("device", "limit")),
    # advice
    MetricDef("memprof_advice_severity", "memprof.advice.severity", "", "gauge",
              "The most severe advice of this rule now: 0 none, 1 info, 2 warning, 3 critical "
              "(GET /v1/advice has the figures it cites); every rule from the start, at 0", ("id",)),
    # where the memory goes (telemetry/memory_breakdown.py, GET /v1/memory)
    MetricDef("memprof_memory_bytes", "memprof.memory", "By", "gauge",
              "The process's memory on the device by component (weights, kv_cache, heap_in_use, heap_free, "
              "python_heap, file_backed, shared_memory on cpu; weights, kv_cache, activations_other, "
              "allocator_cache, non_torch on CUDA) and unexplained (the total less the components; negative "
              "where a component counts what is not resident): per device they sum to the process's total as the "
              "kernel (RSS) or the driver (NVML's per-process figure) measures it",
              ("device", "component")),
    # allocator
    MetricDef("memprof_allocator_allocated_bytes", "memprof.allocator.allocated", "By", "gauge",
              "Bytes allocated through the allocator", _D),
    MetricDef("memprof_allocator_reserved_bytes", "memprof.allocator.reserved", "By", "gauge",
              "Bytes the allocator holds from the device or OS", _D),
    MetricDef("memprof_allocator_active_bytes", "memprof.allocator.active", "By", "gauge",
              "Bytes in active blocks (allocated plus rounding)", _D),
    MetricDef("memprof_allocator_inactive_split_bytes", "memprof.allocator.inactive_split", "By", "gauge",
              "Free bytes inside split blocks: unusable gaps", _D),
    MetricDef("memprof_allocator_allocated_peak_bytes", "memprof.allocator.allocated_peak", "By", "gauge",
              "Peak allocated bytes since start", _D),
    MetricDef("memprof_allocator_reserved_peak_bytes", "memprof.allocator.reserved_peak", "By", "gauge",
              "Peak reserved bytes since start", _D),
    MetricDef("memprof_allocator_fragmentation_ratio", "memprof.allocator.fragmentation", "1", "gauge",
              "Inactive split bytes / reserved bytes (unusable gaps)", _D),
    MetricDef("memprof_allocator_cache_free_ratio", "memprof.allocator.cache_free", "1", "gauge",
              "(reserved - allocated) / reserved: cached but unused", _D),
    MetricDef("memprof_allocator_alloc_retries_total", "memprof.allocator.alloc_retries", "{retry}", "counter",
              "Allocations that failed and were retried after freeing the cache", _D),
    MetricDef("memprof_allocator_ooms_total", "memprof.allocator.ooms", "{oom}", "counter",
              "Out-of-memory errors raised by the allocator", _D),
    # GPU via NVML
    MetricDef("memprof_gpu_memory_used_bytes", "memprof.gpu.memory.used", "By", "gauge",
              "Device memory in use (all processes), from NVML", _G),
    MetricDef("memprof_gpu_memory_total_bytes", "memprof.gpu.memory.total", "By", "gauge",
              "Device memory total, from NVML", _G),
    MetricDef("memprof_gpu_process_memory_used_bytes", "memprof.gpu.process.memory.used", "By", "gauge",
              "Device memory used by this process, from NVML; absent where NVML cannot see this "
              "process (a container's PID namespace; memprof_source_up of source nvml_process is 0)", _G),
    MetricDef("memprof_gpu_process_torch_reserved_bytes", "memprof.gpu.process.torch_reserved", "By", "gauge",
              "Bytes torch's CUDA caching allocator of this process reserves on this GPU: a lower bound "
              "of the process's GPU memory (no CUDA context, no other libraries' memory)", _G),
    MetricDef("memprof_gpu_mig_memory_used_bytes", "memprof.gpu.mig.memory.used", "By", "gauge",
              "Memory in use on one MIG device (all processes on it), from NVML", _M),
    MetricDef("memprof_gpu_mig_memory_total_bytes", "memprof.gpu.mig.memory.total", "By", "gauge",
              "Memory of one MIG device, from NVML", _M),
    MetricDef("memprof_cuda_device_info", "memprof.cuda_device_info", "", "info",
              "Which GPU torch's CUDA device is: our GPU labels and dcgm-exporter's (UUID, GPU_I_ID)",
              ("device", "gpu", "gpu_uuid", "UUID", "mig_uuid", "GPU_I_ID")),
    MetricDef("memprof_gpu_info", "memprof.gpu_info", "", "info",
              "GPU identity", ("gpu", "gpu_uuid", "gpu_model", "driver_version")),
    # process
    MetricDef("memprof_process_resident_memory_bytes", "memprof.process.resident_memory", "By", "gauge",
              "Resident set size"),
    MetricDef("memprof_process_virtual_memory_bytes", "memprof.process.virtual_memory", "By", "gauge",
              "Virtual memory size"),
    MetricDef("memprof_process_peak_resident_memory_bytes", "memprof.process.peak_resident_memory", "By",
              "gauge", "Peak resident set size (VmHWM)"),
    MetricDef("memprof_process_memory_limit_bytes", "memprof.process.memory_limit", "By", "gauge",
              "Memory limit of the process's cgroup (the tightest on the way up), when set"),
    MetricDef("memprof_process_children_resident_memory_bytes", "memprof.process.children.resident_memory",
              "By", "gauge", "Resident set size of all descendant processes"),
    MetricDef("memprof_process_cpu_seconds_total", "memprof.process.cpu", "s", "counter",
              "CPU time (user + system, all threads) the process has used"),
    MetricDef("memprof_process_cpu_utilization_ratio", "memprof.process.cpu_utilization", "1", "gauge",
              "CPU time / wall time / CPU capacity over the last sampler interval; the capacity is the "
              "cgroup CPU quota in cores when one is set (at most the CPUs the process may run on), "
              "else those CPUs"),
    MetricDef("memprof_process_io_read_bytes_total", "memprof.process.io.read", "By", "counter",
              "Bytes read from storage by the process and its children"),
    MetricDef("memprof_process_io_write_bytes_total", "memprof.process.io.write", "By", "counter",
              "Bytes written to storage by the process and its children"),
    # container (the process's cgroup; absent without one)
    MetricDef("memprof_container_memory_usage_bytes", "memprof.container.memory.usage", "By", "gauge",
              "Memory charged to the process's cgroup (memory.current / memory.usage_in_bytes): "
              "all its processes, page cache and kernel memory included"),
    MetricDef("memprof_container_memory_working_set_bytes", "memprof.container.memory.working_set", "By",
              "gauge", "Cgroup memory usage minus inactive file pages: what the kubelet evicts on and "
              "what cannot be reclaimed before an OOM kill"),
    MetricDef("memprof_container_oom_kills_total", "memprof.container.oom_kills", "{oom_kill}", "counter",
              "Processes the kernel OOM-killed in the process's cgroup (memory.events / "
              "memory.oom_control oom_kill)"),
    MetricDef("memprof_container_memory_events_total", "memprof.container.memory.events", "{event}", "counter",
              "Times the process's cgroup reached its memory.high (event high: throttled and reclaimed) or "
              "its memory limit (event max: v2 memory.events max; v1 memory.failcnt, charges that hit the "
              "limit), the kernel's last steps before an OOM kill", ("event",)),
    MetricDef("memprof_memory_pressure_stall_seconds_total", "memprof.memory.pressure.stall", "s", "counter",
              "Time tasks stalled waiting for memory (PSI; kind some: at least one task, full: all non-idle "
              "tasks at once), of the process's cgroup (scope cgroup: cgroup v2 memory.pressure) or, where "
              "the cgroup has none, of the whole machine (scope system: /proc/pressure/memory)",
              ("kind", "scope")),
    MetricDef("memprof_container_cpu_limit_cores", "memprof.container.cpu.limit_cores", "{cpu}", "gauge",
              "CPU quota of the process's cgroup in cores (quota / period), when set"),
    # operations
    MetricDef("memprof_operation_duration_seconds", "memprof.operation.duration", "s", "histogram",
              "Duration of operations", ("operation",)),
    MetricDef("memprof_operation_memory_peak_bytes", "memprof.operation.memory_peak", "By", "histogram",
              "Memory level at the operation's peak (RSS or allocator, whichever is larger)", ("operation",)),
    MetricDef("memprof_operation_memory_peak_increase_bytes", "memprof.operation.memory_peak_increase", "By",
              "histogram", "The operation's own memory need: peak during it minus the level at its start "
              "(largest over RSS and each allocator read at its start)", ("operation",)),
    MetricDef("memprof_operation_memory_delta_bytes", "memprof.operation.memory_delta", "By", "gauge",
              "RSS at the end minus at the start of the last operation of that name", ("operation",)),
    # watchdog
    MetricDef("memprof_alert_active", "memprof.alert_active", "", "gauge",
              "1 while the watchdog rule is firing", _R),
    MetricDef("memprof_watchdog_alerts_total", "memprof.watchdog.alerts", "{alert}", "counter",
              "Times the watchdog rule started firing", _R),
    MetricDef("memprof_watchdog_threshold", "memprof.watchdog.threshold", "", "gauge",
              "Deprecated for rules on metrics with a unit (use memprof_watchdog_threshold_bytes, "
              "_seconds or _ratio): the threshold of every rule, in its metric's unit", _R),
    MetricDef("memprof_watchdog_threshold_bytes", "memprof.watchdog.threshold_bytes", "By", "gauge",
              "Threshold of the watchdog rules on a metric in bytes", _R),
    MetricDef("memprof_watchdog_threshold_seconds", "memprof.watchdog.threshold_seconds", "s", "gauge",
              "Threshold of the watchdog rules on a metric in seconds", _R),
    MetricDef("memprof_watchdog_threshold_ratio", "memprof.watchdog.threshold_ratio", "1", "gauge",
              "Threshold of the watchdog rules on a ratio metric (0..1)", _R),
    # self
    MetricDef("memprof_overhead_seconds_total", "memprof.overhead", "s", "counter",
              "Time memprof_otel added to forwards (hooks plus measured slowdown of attributed forwards)",
              ("model",)),
    MetricDef("memprof_source_up", "memprof.source_up", "", "gauge",
              "1 when the memory source answered the last sample (blackbox: 1 while the black box "
              "records post-mortem evidence)", ("source",)),
    MetricDef("memprof_sampler_duration_seconds", "memprof.sampler.duration", "s", "gauge",
              "Time the last sampler tick took"),
    MetricDef("memprof_sampler_last_success_timestamp_seconds", "memprof.sampler.last_success_timestamp", "s",
              "gauge", "Unix time of the last tick that read the process source"),
    MetricDef("memprof_sampler_errors_total", "memprof.sampler.errors", "{error}", "counter",
              "Source reads that raised, timed out or returned garbage", ("source",)),
    MetricDef("memprof_events_dropped_total", "memprof.events_dropped", "{event}", "counter",
              "Timeline events dropped because the buffer was full", ("model",)),
    MetricDef("memprof_forwards_unattributed_total", "memprof.forwards.unattributed", "{forward}", "counter",
              "Attributed forwards whose per-layer figures were dropped rather than published wrong, by "
              "reason (concurrent: CUDA or TensorFlow allocator statistics read while another forward ran; trace_lost: "
              "the allocator trace could not give the forward's events)", ("model", "reason")),
    MetricDef("memprof_export_errors_total", "memprof.export_errors", "{error}", "counter",
              "Failed exports", ("exporter",)),
    MetricDef("memprof_config_errors_total", "memprof.config_errors", "{error}", "counter",
              "Configuration values ignored at startup (the config file's value, else the default, kept), "
              "by where they came from",
              ("source",)),
    MetricDef("memprof_http_connection_errors_total", "memprof.http.connection_errors", "{error}", "counter",
              "Connections to the endpoint's own server that failed, by reason: timeout, reset, broken_pipe, "
              "other (the client's side) or internal (the endpoint's own code)", ("reason",)),
    MetricDef("memprof_postmortems_total", "memprof.postmortems", "{postmortem}", "counter",
              "Processes of this service that ended without a clean shutdown (their black box left "
              "behind; a graceful stop is not one), by reason: oom_kill, killed, exited; the service's "
              "count, the same in every process (GET /v1/postmortem)", ("reason",)),
    MetricDef("memprof_dumps_total", "memprof.dumps", "{dump}", "counter",
              "Dumps attempted by format and result", ("format", "result")),
    MetricDef("memprof_layers_tracked", "memprof.layers.tracked", "{layer}", "gauge",
              "Layers of the model with figures (every one is in /v1/layers, dumps and captures)", ("model",)),
    MetricDef("memprof_layers_exported", "memprof.layers.exported", "{layer}", "gauge",
              "Layers of the model exported as per-layer series (series.layers: every one, or the top ones)",
              ("model",)),
    MetricDef("memprof_series_exported", "memprof.series.exported", "{series}", "gauge",
              "Samples in the last /metrics answer this process gave (in single-port mode every worker's "
              "series; absent before the first)"),
    MetricDef("memprof_series_budget", "memprof.series.budget", "{series}", "gauge",
              "Series this process may export (series.budget): MemprofSeriesOverBudget fires above it"),
    MetricDef("memprof_build_info", "memprof.build_info", "", "info",
              "memprof_otel and framework versions (empty for a framework not in use), and the service's own "
              "(service.version in OTEL_RESOURCE_ATTRIBUTES; empty where unset)",
              ("version", "torch_version", "keras_version", "tensorflow_version", "jax_version", "service_version")),
)

BY_PROM: dict[str, MetricDef] = {m.prom: m for m in METRICS}


def metric(prom_name: str) -> MetricDef:
    return BY_PROM[prom_name]
