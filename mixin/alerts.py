"""The alert rules, one function each, built from the configuration.

Adding an alert: write a function below decorated with ``@alert("Name")`` that returns a
``Rule``, add its defaults under ``alerts.rules`` in config.yaml (``enabled``, ``severity``,
``for`` and its thresholds), its promtool cases in deploy/prometheus/alerts_test.yml, and its
section in docs/runbooks.md (the heading is the alert's name: the runbook_url anchor).

Every selector goes through ``c.m(...)`` so the configured extra matchers reach it. Thresholds,
``for`` durations and the words that describe them come from the same configuration values, so
the annotations never disagree with the expression.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .promql import duration_seconds, duration_words, iec_bytes, matchers, number, percent, seconds_words, series


@dataclass(frozen=True)
class Rule:
    alert: str
    expr: str
    summary: str
    description: str
    severity: str = ""           # "" takes the configured severity
    for_: str | None = None      # None takes the configured `for`, if any
    comment: str = ""            # why the rule is written this way (a comment in alerts.yml)


@dataclass(frozen=True)
class Ctx:
    """What an alert function sees: its own settings and the selector helpers."""
    params: dict[str, Any]
    selector: str
    job_selector: str

    def m(self, name: str, *parts: str) -> str:
        """A series selector carrying the configured extra matchers."""
        return series(name, *parts, self.selector)


# matchers used inside f-strings (a backslash there needs Python 3.12)
NOT_CPU, CUDA = 'device!="cpu"', 'device=~"cuda:.*"'
NOT_NVML, NVML = 'source!="nvml"', 'source="nvml"'
OTLP = 'exporter=~"otlp_.*"'
WHOLE_GPU, MIG_SLICE = 'mig_uuid=""', 'mig_uuid!=""'

AlertFn = Callable[[Ctx], Rule]
ALERTS: dict[str, AlertFn] = {}


def alert(name: str) -> Callable[[AlertFn], AlertFn]:
    def register(fn: AlertFn) -> AlertFn:
        ALERTS[name] = fn
        return fn
    return register


# ---------------------------------------------------------------------------- the rules

@alert("MemprofTargetDown")
def target_down(c: Ctx) -> Rule:
    f = duration_words(c.params["for"])
    return Rule(
        "MemprofTargetDown",
        f"{series('up', matchers(c.job_selector, c.selector))} == 0",
        "memprof-otel endpoint {{ $labels.instance }} is down",
        "Prometheus has not been able to scrape {{ $labels.instance }} (job {{ $labels.job }}) "
        f"for {f}. The endpoint runs inside the instrumented process, so the process has "
        "probably exited (crash, OOM kill) or its HTTP server stopped. No other memprof alert "
        "can fire for this instance until it is back.",
        comment="The endpoint lives inside the instrumented process: a target that stops answering usually\n"
                "means the server itself died (crash, OOM kill), hence critical.")


@alert("MemprofOutOfMemory")
def out_of_memory(c: Ctx) -> Rule:
    w = c.params["window"]
    return Rule(
        "MemprofOutOfMemory",
        f"increase({c.m('memprof_allocator_ooms_total')}[{w}]) > 0",
        "Out-of-memory errors on {{ $labels.device }} at {{ $labels.instance }}",
        "The {{ $labels.device }} allocator of {{ $labels.instance }} raised out-of-memory errors "
        f"in the last {duration_words(w)} (about {{{{ $value | printf \"%.0f\" }}}}). Requests that hit them "
        "failed; the operation spans carry an exception event with the memory figures.")


@alert("MemprofAllocatorRetries")
def allocator_retries(c: Ctx) -> Rule:
    w = c.params["window"]
    return Rule(
        "MemprofAllocatorRetries",
        f"rate({c.m('memprof_allocator_alloc_retries_total')}[{w}]) > 0",
        "Allocator retries on {{ $labels.device }} at {{ $labels.instance }}",
        "The {{ $labels.device }} allocator of {{ $labels.instance }} retried failed allocations "
        f"after freeing its cache ({{{{ $value | printf \"%.2g\" }}}} retries/s over {duration_words(w)}). "
        "Each retry stalls the device; memory is close to full.",
        comment="A retry means an allocation failed, the allocator freed its cached blocks and tried again:\n"
                "a device-wide synchronisation on the request path, and the last step before an OOM.")


@alert("MemprofFragmentationHigh")
def fragmentation_high(c: Ctx) -> Rule:
    p = c.params
    return Rule(
        "MemprofFragmentationHigh",
        f"{c.m('memprof_allocator_fragmentation_ratio', NOT_CPU)} > {number(p['ratio'])}\n"
        "and on(instance, job, worker, device)\n"
        f"{c.m('memprof_allocator_reserved_bytes')} > {number(p['min_reserved_bytes'])}",
        "{{ $labels.device }} allocator at {{ $labels.instance }} is {{ $value | humanizePercentage }} fragmented",
        f"For {duration_words(p['for'])} {{{{ $value | humanizePercentage }}}} of the memory reserved by the "
        f"{{{{ $labels.device }}}} allocator (over {iec_bytes(p['min_reserved_bytes'])}) has been in unusable split "
        "blocks. Large allocations can fail although enough memory is free in total; see "
        "memprof_layer_fragmentation_ratio for the layers involved.",
        comment="fragmentation = inactive split blocks / reserved (docs/reference.md): memory that is\n"
                "reserved and free but too fragmented to serve a large request. Ignored while little is\n"
                "reserved, and for the host allocator: glibc serves large requests with mmap, so its gaps\n"
                "cannot fail one, and they are routinely high (~45% in the healthy CPU demo).")


@alert("MemprofMemoryBaselineGrowth")
def memory_baseline_growth(c: Ctx) -> Rule:
    p = c.params

    def floor_growth(metric: str, on: str) -> str:
        now = f"quantile_over_time(0.1, {c.m(metric)}[1h])"
        before = f"quantile_over_time(0.1, {c.m(metric)}[1h] offset 1h)"
        return ("(\n"
                f"  {now}\n    / {before} - 1 > {number(p['growth_ratio'])}\n"
                f"  and on({on})\n"
                f"  {now}\n    - {before} > {number(p['min_growth_bytes'])}\n"
                f"  and on({on})\n"
                f"  {c.m(metric)} offset 2h\n"
                ")")
    return Rule(
        "MemprofMemoryBaselineGrowth",
        floor_growth("memprof_process_resident_memory_bytes", "instance, job") + "\nor\n"
        + floor_growth("memprof_allocator_allocated_bytes", "instance, job, device"),
        "Memory baseline of {{ $labels.instance }}{{ with $labels.device }} ({{ . }} allocator){{ end }} "
        "grew {{ $value | humanizePercentage }} in an hour",
        "The floor of {{ if $labels.device }}memory allocated on {{ $labels.device }}{{ else }}process "
        "resident memory{{ end }} (10th percentile over the last hour) is {{ $value | humanizePercentage }} "
        f"above the hour before, and more than {iec_bytes(p['min_growth_bytes'])} higher. Memory that keeps "
        "rising under steady traffic is a leak signal: look at memprof_layer_retained_bytes per layer, or take "
        "a dump (POST /v1/dumps).",
        comment="Leak signal. The \"baseline\" is the 10th percentile over an hour rather than the minimum:\n"
                "it ignores transient peaks, and a few minutes of low readings (start-up before the model is\n"
                "loaded, a restart) that would otherwise stand as the previous hour's floor and make a\n"
                "healthy process look like it grew. The `offset 2h` term waits until the previous hour is\n"
                "fully covered by data. Fires when the last hour's baseline grew by more than the ratio and\n"
                "the bytes configured; the value is the growth as a fraction (0.25 = +25%).")


@alert("MemprofMemoryLeakSuspected")
def memory_leak_suspected(c: Ctx) -> Rule:
    f = duration_words(c.params["for"])
    return Rule(
        "MemprofMemoryLeakSuspected",
        f"{c.m('memprof_memory_growth_bytes_per_second')}\n"
        f"  and on(instance, job, worker, source, device) ({c.m('memprof_memory_leak_suspected')} == 1)\n"
        "or\n"
        f"{c.m('memprof_layer_growth_bytes_per_second')}\n"
        f"  and on(instance, job, worker, model, layer, device) ({c.m('memprof_layer_leak_suspected')} == 1)",
        "{{ if $labels.layer }}Layer {{ $labels.layer }} of {{ $labels.model }}{{ else if $labels.device }}"
        "{{ $labels.device }} allocator{{ else }}Process memory{{ end }} at {{ $labels.instance }} looks like "
        "a leak ({{ $value | humanize1024 }}B/s)",
        "{{ if $labels.layer }}Tensors born in layer {{ $labels.layer }} of model {{ $labels.model }} "
        "({{ $labels.device }}) during attributed forwards stay alive and keep adding up{{ else if $labels.device }}"
        "The floor of memory allocated on {{ $labels.device }} keeps rising{{ else }}The floor of the "
        "process's resident memory keeps rising{{ end }}: {{ $value | humanize1024 }}B/s, a significant "
        f"trend for {f}. GET /v1/leaks on the endpoint shows the window it was measured over "
        "and the layers with the most surviving bytes.",
        comment="The in-process leak detector (docs/reference.md, \"Leaks\"): a Theil-Sen trend over the\n"
                "per-interval floor of the RSS, of each allocator's allocated bytes and of each layer's\n"
                "surviving bytes, flagged only when the slope is significant (its lower confidence bound and\n"
                "the growth over the window past thresholds, three floors in a row). A sawtooth (a KV cache\n"
                "dropped per request) and a plateau never raise the flag. The value is the slope in bytes/s.\n"
                "MemprofMemoryBaselineGrowth is the PromQL-only view of the same question, on raw series.")


@alert("MemprofMemoryFullIn1h")
def memory_full_in_1h(c: Ctx) -> Rule:
    return Rule(
        "MemprofMemoryFullIn1h",
        f"predict_linear({c.m('memprof_process_resident_memory_bytes')}[30m], 3600)\n"
        f"  > on(instance, job, worker) {c.m('memprof_process_memory_limit_bytes')}\n"
        "or\n"
        f"predict_linear({c.m('memprof_allocator_reserved_bytes', CUDA)}[30m], 3600)\n"
        "  > on(instance, job, worker, device)\n"
        "    (\n"
        f"      {c.m('memprof_cuda_device_info', WHOLE_GPU)}\n"
        f"        * on(instance, job, worker, gpu_uuid) group_left() {c.m('memprof_gpu_memory_total_bytes')}\n"
        "      or\n"
        f"      {c.m('memprof_cuda_device_info', MIG_SLICE)}\n"
        f"        * on(instance, job, worker, mig_uuid) group_left() {c.m('memprof_gpu_mig_memory_total_bytes')}\n"
        "    )",
        "{{ if $labels.device }}{{ $labels.device }} allocator{{ else }}Process memory{{ end }} of "
        "{{ $labels.instance }} is on course to hit its limit within an hour",
        "At the rate of the last 30 minutes, {{ if $labels.device }}the memory reserved by the "
        "{{ $labels.device }} allocator will exceed the GPU's total memory{{ else }}resident memory "
        "will exceed the cgroup memory limit{{ end }} within an hour (projected "
        "{{ $value | humanize1024 }}B).",
        comment="Projects the last 30 minutes an hour ahead: RSS against the cgroup limit, and what CUDA's\n"
                "caching allocator reserves against the memory of the GPU it is on. torch's `cuda:N` is\n"
                "found by UUID through memprof_cuda_device_info, never by index: torch numbers the devices\n"
                "CUDA_VISIBLE_DEVICES leaves, in its order, NVML numbers all it sees in PCI order. On a MIG\n"
                "device the limit is the MIG device's own memory. The value is the projected size in bytes.")


@alert("MemprofContainerMemoryFullSoon")
def container_memory_full_soon(c: Ctx) -> Rule:
    p = c.params
    w, h = p["window"], p["horizon"]
    ws = c.m("memprof_container_memory_working_set_bytes")
    return Rule(
        "MemprofContainerMemoryFullSoon",
        f"predict_linear({ws}[{w}], {number(duration_seconds(h))})\n"
        f"  / on(instance, job, worker) {c.m('memprof_process_memory_limit_bytes')} > 1\n"
        f"and on(instance, job, worker) {ws} offset {w}",
        "Container of {{ $labels.instance }} is on course to reach its memory limit within "
        f"{duration_words(h)}",
        f"At the trend of the last {duration_words(w)}, the working set of the container (cgroup) of "
        f"{{{{ $labels.instance }}}} reaches its memory limit within {duration_words(h)} (projected "
        "{{ $value | humanizePercentage }} of the limit); it has been on that course for "
        f"{duration_words(p['for'])}. At the limit the kernel OOM-kills a process of the container, "
        "usually this one. The runbook says how to see whether the kernel is reclaiming already "
        "(memory pressure, the cgroup's memory events).",
        comment="The early warning of an OOM kill: the working set (what the kernel cannot reclaim) projected\n"
                "`horizon` ahead by a least-squares line over `window`, against the cgroup limit. A flat\n"
                "series near the limit projects below it, and over a window of several teeth a sawtooth's line\n"
                "stays flat. `offset window` waits until the window is covered (a process loading its model\n"
                "climbs steeply, then stops). Measured on a real leak into a cgroup (docs/runbooks.md): the\n"
                "lead before the kill is the horizon less the scrape, evaluation and `for` delays. The value\n"
                "is the projected working set over the limit (1.2 = 20 % over it).")


@alert("MemprofWorkingSetNearCgroupLimit")
def working_set_near_cgroup_limit(c: Ctx) -> Rule:
    p = c.params
    return Rule(
        "MemprofWorkingSetNearCgroupLimit",
        f"{c.m('memprof_container_memory_working_set_bytes')}\n"
        f"  / on(instance, job, worker) {c.m('memprof_process_memory_limit_bytes')} > {number(p['ratio'])}",
        "Working set of {{ $labels.instance }}'s container is {{ $value | humanizePercentage }} of its memory limit",
        f"The container (cgroup) of {{{{ $labels.instance }}}} has had a working set above {percent(p['ratio'])} "
        f"of its memory limit for {duration_words(p['for'])} ({{{{ $value | humanizePercentage }}}} now). The "
        "working set counts every process in the container and the page cache that cannot be reclaimed; "
        "when it reaches the limit the kernel OOM-kills a process. Compare "
        "memprof_process_resident_memory_bytes (this process) with "
        "memprof_container_memory_working_set_bytes (the whole container) to see who holds it.",
        comment="The kernel OOM-kills on the cgroup's memory, not the process's RSS: page cache, tmpfs/shm\n"
                "and the other processes of the container count too. The working set (usage minus\n"
                "inactive file pages, which the kernel reclaims first) is what the kubelet evicts on.")


@alert("MemprofContainerOomKilled")
def container_oom_killed(c: Ctx) -> Rule:
    w = c.params["window"]
    return Rule(
        "MemprofContainerOomKilled",
        f"increase({c.m('memprof_container_oom_kills_total')}[{w}]) > 0",
        "The kernel OOM-killed a process in {{ $labels.instance }}'s container",
        "The container (cgroup) of {{ $labels.instance }} reached its memory limit and the kernel "
        f"killed {{{{ $value | printf \"%.0f\" }}}} process(es) in it in the last {duration_words(w)}. Whatever "
        "they were serving failed. See memprof_container_memory_working_set_bytes against "
        "memprof_process_memory_limit_bytes, and the kernel log of the node.",
        comment="A process of the container was OOM-killed: a worker, a child, or this process in an earlier\n"
                "life if its container survived. (When the kernel kills the instrumented process itself\n"
                "the endpoint dies with it: MemprofTargetDown.)")


@alert("MemprofPostmortem")
def postmortem(c: Ctx) -> Rule:
    w = c.params["window"]
    pm = c.m("memprof_postmortems_total", 'reason=~"oom_kill|killed"')
    return Rule(
        "MemprofPostmortem",
        f"increase({pm}[{w}]) > 0\nor\n({pm} > 0 unless {pm} offset {w})",
        "A process before {{ $labels.instance }} ended by {{ $labels.reason }}",
        "{{ $labels.instance }} started after a process of its service that was ended by "
        "{{ $labels.reason }} (no clean shutdown) and reported it in the last " f"{duration_words(w)}. "
        "What it was doing when it died (the forward in flight: model, shape, layer) and its last "
        "minute of memory: memprof-otel postmortem --url, or GET /v1/postmortem on the instance.",
        comment="The process that reports a post-mortem is the one that started after the dead one: its\n"
                "counter starts at its count. increase() catches a restart under the same labels, the\n"
                "unless-offset part a new instance (a new pod IP) that had no series a window ago.")


@alert("MemprofRssNearCgroupLimit")
def rss_near_cgroup_limit(c: Ctx) -> Rule:
    p = c.params
    return Rule(
        "MemprofRssNearCgroupLimit",
        f"{c.m('memprof_process_resident_memory_bytes')}\n"
        f"  / on(instance, job, worker) {c.m('memprof_process_memory_limit_bytes')} > {number(p['ratio'])}\n"
        f"unless on(instance, job, worker) {c.m('memprof_container_memory_working_set_bytes')}",
        "{{ $labels.instance }} uses {{ $value | humanizePercentage }} of its cgroup memory limit",
        f"Resident memory of {{{{ $labels.instance }}}} has been above {percent(p['ratio'])} of its cgroup "
        f"memory limit for {duration_words(p['for'])} ({{{{ $value | humanizePercentage }}}} now). The kernel "
        "OOM-kills the container when the cgroup reaches its limit.",
        comment="Fallback for targets without the container figures (memprof-otel before they existed, or\n"
                "a cgroup whose usage cannot be read): RSS is a lower bound of what the kernel counts.")


@alert("MemprofGpuMemoryNearFull")
def gpu_memory_near_full(c: Ctx) -> Rule:
    p = c.params
    return Rule(
        "MemprofGpuMemoryNearFull",
        f"{c.m('memprof_gpu_memory_used_bytes')} / {c.m('memprof_gpu_memory_total_bytes')} > {number(p['ratio'])}",
        "GPU {{ $labels.gpu }} seen by {{ $labels.instance }} is {{ $value | humanizePercentage }} full",
        f"NVML has reported GPU {{{{ $labels.gpu }}}} ({{{{ $labels.gpu_uuid }}}}) more than {percent(p['ratio'])} "
        f"full for {duration_words(p['for'])}. This counts every process on the device "
        "(memprof_gpu_process_memory_used_bytes is this process's share); the next allocation "
        "peak may fail with an out-of-memory error.")


# capacity: the memory model of each instrumented model (memprof_capacity_*). Its figures are per
# (model, device) of one process; the target labels and these two pair them one to one.
CAPACITY_ON = "on(instance, job, worker, model, device)"


def _count_words(n: float) -> str:
    """1 -> 'one', 2 -> 'two', ... up to ten; other numbers as written in PromQL."""
    words = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
    return words[int(n) - 1] if float(n).is_integer() and 1 <= n <= 10 else number(n)


@alert("MemprofHeadroomLow")
def headroom_low(c: Ctx) -> Rule:
    p = c.params
    peaks = p["peaks"]
    predicted = c.m("memprof_capacity_predicted_peak_bytes")
    more = "one more" if peaks == 1 else f"{number(peaks)} more"
    one = peaks == 1
    return Rule(
        "MemprofHeadroomLow",
        f"{c.m('memprof_capacity_headroom_bytes')}\n"
        f"  < {CAPACITY_ON}\n"
        f"  {predicted if peaks == 1 else f'({predicted} * {number(peaks)})'}",
        "{{ $labels.model }} on {{ $labels.device }} at {{ $labels.instance }} has headroom for less than "
        f"{more} of its largest recent forwards",
        f"For {duration_words(p['for'])} the headroom of model {{{{ $labels.model }}}} on {{{{ $labels.device }}}} "
        "of {{ $labels.instance }} ({{ $value | humanize1024 }}B: what is left under the limit once the "
        "predicted peak of its largest recent input shape, the fit error, the memory in use now and the "
        "margin are taken off) has been smaller than "
        f"{'that predicted peak' if one else f'{number(peaks)} times that predicted peak'}. "
        f"At most {_count_words(peaks)} forward{'' if one else 's'} of that shape fit{'s' if one else ''} "
        f"now: {_count_words(peaks + 1)} at once, or memory in use growing by {more} such "
        f"peak{'' if one else 's'}, would run out of memory. GET /v1/headroom on the endpoint (or "
        "memprof-otel headroom) gives the largest batch that fits now per sequence length.",
        comment="The headroom already has the largest recent shape's predicted peak (plus its fit error), what\n"
                "is in use now and the margin taken off, so headroom < predicted peak means room for that\n"
                "forward once but not twice: concurrent requests of that size, or the memory in use growing\n"
                "by one such peak (a KV cache, a second model), would OOM. `peaks` is how many more such\n"
                "peaks must fit (raise it to the concurrency you serve). 10m: the memory in use moves with\n"
                "every request, so a short dip is normal; this is a capacity warning, not an imminent\n"
                "failure (MemprofHeadroomExhausted is that).")


@alert("MemprofHeadroomExhausted")
def headroom_exhausted(c: Ctx) -> Rule:
    p = c.params
    return Rule(
        "MemprofHeadroomExhausted",
        f"{c.m('memprof_capacity_headroom_bytes')} < 0",
        "Largest recent forward of {{ $labels.model }} on {{ $labels.device }} at {{ $labels.instance }} "
        "would not fit now",
        f"For {duration_words(p['for'])} the headroom of model {{{{ $labels.model }}}} on {{{{ $labels.device }}}} "
        "of {{ $labels.instance }} has been below zero ({{ $value | humanize1024 }}B): its largest input "
        "shape of the recent window, sent now, is predicted to need more memory than is left under the "
        "limit (fit error and margin included). The next request of that size will probably fail with "
        "an out-of-memory error. GET /v1/headroom on the endpoint (or memprof-otel headroom) gives the "
        "largest batch that fits now per sequence length.",
        comment="Below 0 the largest shape seen in the recent window (capacity.recent_window of the process,\n"
                "15 minutes by default) is predicted not to fit in what is free now: the next request of that\n"
                "size is expected to OOM, hence critical. 5m: the memory in use now moves with the requests\n"
                "in flight, and a burst of concurrent ones can push the headroom under 0 for a moment\n"
                "without anything being wrong once they finish; five minutes of it is the steady state.")


@alert("MemprofCapacityModelInaccurate")
def capacity_model_inaccurate(c: Ctx) -> Rule:
    p = c.params
    return Rule(
        "MemprofCapacityModelInaccurate",
        f"{c.m('memprof_capacity_fit_error_ratio')} > {number(p['ratio'])}",
        "Memory model of {{ $labels.model }} on {{ $labels.device }} at {{ $labels.instance }} is off by "
        "{{ $value | humanizePercentage }}",
        f"For {duration_words(p['for'])} the memory model of {{{{ $labels.model }}}} on {{{{ $labels.device }}}} "
        "of {{ $labels.instance }} has predicted the peak of input shapes it was not fitted on with an error "
        f"of up to {{{{ $value | humanizePercentage }}}} (more than {percent(p['ratio'])}). Its headroom and "
        "max-safe-batch figures are not to be trusted: the input shape read from the forward's arguments "
        "probably does not say what drives its memory. Give the model a shape_of function that returns "
        "the batch, sequence length and cache length of its inputs.",
        comment="fit error = the worst leave-one-shape-out relative error of the model's peak prediction.\n"
                "When the shape is read right, a forward's peak follows it closely and the error stays small;\n"
                "past 20% the shape is not what drives the memory (padded or packed inputs, a cache the\n"
                "shape does not see, data-dependent branches), and since the headroom takes the error off,\n"
                "it eats the headroom as well. 30m: the error moves while the model learns\n"
                "new shapes; one that stays is structural. Not urgent: about trusting the figures.")


@alert("MemprofSamplerStale")
def sampler_stale(c: Ctx) -> Rule:
    return Rule(
        "MemprofSamplerStale",
        f"time() - {c.m('memprof_sampler_last_success_timestamp_seconds')} > {number(c.params['max_age_seconds'])}",
        "memprof sampler of {{ $labels.instance }} last succeeded {{ $value | humanizeDuration }} ago",
        "The metrics of {{ $labels.instance }} come from a sample {{ $value | humanizeDuration }} "
        "old: the sampler thread is stuck or every source fails (see memprof_sampler_errors_total, "
        "memprof_source_up and /healthz).",
        comment="Every figure is served from the last sampler snapshot, so a stuck sampler would otherwise\n"
                "go unnoticed: the endpoint keeps answering with old values.")


@alert("MemprofSamplerSlow")
def sampler_slow(c: Ctx) -> Rule:
    p = c.params
    return Rule(
        "MemprofSamplerSlow",
        f"{c.m('memprof_sampler_duration_seconds')} > {number(p['max_duration_seconds'])}",
        "memprof sampler of {{ $labels.instance }} takes {{ $value | humanizeDuration }} per sample",
        f"For {duration_words(p['for'])} one sample has taken more than {seconds_words(p['max_duration_seconds'])} "
        "on {{ $labels.instance }} ({{ $value | humanizeDuration }} now). The sampler competes with the "
        "workload for CPU time; raise sampler.interval or look for a slow source (memprof_source_up, "
        "memprof_sampler_errors_total).")


@alert("MemprofSourceDown")
def source_down(c: Ctx) -> Rule:
    return Rule(
        "MemprofSourceDown",
        f"{c.m('memprof_source_up', NOT_NVML)} == 0\n"
        "or\n"
        f"{c.m('memprof_source_up', NVML)} == 0\n"
        "  and on(instance, job, worker)\n"
        f"  count by (instance, job, worker) ({c.m('memprof_allocator_reserved_bytes', CUDA)})",
        "memprof source {{ $labels.source }} of {{ $labels.instance }} is down",
        f"The {{{{ $labels.source }}}} memory source of {{{{ $labels.instance }}}} has failed every sample for "
        f"{duration_words(c.params['for'])}: the figures it feeds are missing or stale while the others "
        "keep coming. memprof_sampler_errors_total{source} counts the failures; the process log has "
        "their reason.",
        comment="A source that fails keeps the others running (the sampler marks it down and goes on), so only\n"
                "this alert says its figures are gone. nvml is down on every machine without a GPU, so it only\n"
                "counts where the process uses CUDA (an allocator series on a cuda:N device).")


@alert("MemprofOtlpExportFailing")
def otlp_export_failing(c: Ctx) -> Rule:
    w = c.params["window"]
    return Rule(
        "MemprofOtlpExportFailing",
        f"rate({c.m('memprof_export_errors_total', OTLP)}[{w}]) > 0",
        "OTLP export {{ $labels.exporter }} of {{ $labels.instance }} is failing",
        f"For {duration_words(c.params['for'])} the {{{{ $labels.exporter }}}} exporter of {{{{ $labels.instance }}}} "
        f"has failed exports ({{{{ $value | printf \"%.2g\" }}}} failures/s over {duration_words(w)}): what it pushes "
        "over OTLP (metrics or spans) is being dropped at the collector's door. The model is not slowed "
        "and /metrics is unaffected.",
        comment="Exports run on background threads and a failed one costs nothing but this counter, so a\n"
                "collector outage is silent without this alert. A single failed export (a collector restart)\n"
                "does not last the `for`.")


@alert("MemprofSeriesOverBudget")
def series_over_budget(c: Ctx) -> Rule:
    return Rule(
        "MemprofSeriesOverBudget",
        f"{c.m('memprof_series_exported')} > {c.m('memprof_series_budget')}",
        "{{ $labels.instance }} exports {{ $value | printf \"%.0f\" }} series, over its budget",
        f"For {duration_words(c.params['for'])} the /metrics answer of {{{{ $labels.instance }}}} has held "
        "{{ $value | printf \"%.0f\" }} series, more than its series.budget "
        "(memprof_series_budget). Multiplied by the fleet's pods, that is what your Prometheus ingests: "
        "set series.layers: top (or lower series.top_layers) so that only the largest layers get "
        "per-layer series, or raise series.budget if the count is intended.",
        comment="Cardinality guard for fleets: per-layer series make up most of a process's series, and a\n"
                "model with more layers than expected (or every layer exported) multiplies across every\n"
                "pod. Both sides are the process's own figures (no labels of their own), so they pair\n"
                "one to one on the target labels. 15m: a budget change rolls out with the pods.")


@alert("MemprofWatchdogAlertFiring")
def watchdog_alert_firing(c: Ctx) -> Rule:
    return Rule(
        "MemprofWatchdogAlertFiring",
        f"{c.m('memprof_alert_active')} == 1",
        "Watchdog rule {{ $labels.rule }} is firing on {{ $labels.instance }}",
        "The in-process watchdog rule {{ $labels.rule }} (severity {{ $labels.severity }}) of "
        "{{ $labels.instance }} is firing: its metric is past memprof_watchdog_threshold for the "
        "rule's `for`. GET /v1/alerts on the endpoint shows its value and since when.",
        severity="{{ $labels.severity }}",
        comment="Mirrors the in-process watchdog (config watchdog.rules) into Alertmanager. The rule's own\n"
                "severity label is passed through rather than fixed here.")


# ---------------------------------------------------------------------------- assembling

def rules(cfg: dict[str, Any]) -> list[tuple[Rule, dict[str, Any]]]:
    """(rule, its Prometheus rule mapping) for every enabled alert, in the order above."""
    a = cfg["alerts"]
    configured, known = set(a["rules"]), set(ALERTS)
    if configured != known:
        raise ValueError(f"config alerts.rules and alerts.py disagree: only in the config {sorted(configured - known)}, "
                         f"only in alerts.py {sorted(known - configured)}")
    out = []
    for name, fn in ALERTS.items():
        params = a["rules"][name]
        if not params.get("enabled", True):
            continue
        r = fn(Ctx(params, cfg["selector"], cfg["job_selector"]))
        assert r.alert == name, (r.alert, name)
        doc: dict[str, Any] = {"alert": r.alert, "expr": r.expr}
        if (f := r.for_ if r.for_ is not None else params.get("for")):
            doc["for"] = f
        doc["labels"] = {"severity": r.severity or params["severity"], **a["extra_labels"]}
        doc["annotations"] = {"summary": r.summary, "description": r.description,
                              "runbook_url": f"{a['runbook_url_base']}#{name.lower()}"}
        out.append((r, doc))
    return out
