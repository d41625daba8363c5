"""The Grafana dashboards, built from the configuration (``python -m mixin`` writes them).

Layout, ids, datasource references and template variables are made here so they stay consistent
across the three dashboards. Rules every query here follows (tests/assets checks them, and a test
evaluates every query and every variable query against a real Prometheus scraping the demo):
- it returns data for a running `memprof-otel demo` on CPU (model "minilm", device "cpu",
  operation "embed", at least one watchdog rule), except the panels listed in
  grafana/gpu_only_panels.txt (NVML metrics: no data without a GPU) and
  grafana/cgroup_limit_panels.txt (memprof_process_memory_limit_bytes: no data without a cgroup
  memory limit);
- every selector carries the configured extra matchers and the chained label variables
  (cluster, namespace, job, pod, rank, instance, and model / device / operation where they apply);
- template variables are used only in `=~` matchers (multi-value and "All" render as regexes,
  and "All" is `.*`, which also matches a series without the label);
- only metric names from docs/reference.md's "Prometheus metrics".

Adding a panel: write it in one of the sections of ``overview``, ``layers`` or ``operations``
with ``timeseries(...)`` / ``stat(...)`` / ``table(...)`` and ``target(f"metric{{{q.base}}}")``;
list its title in grafana/gpu_only_panels.txt or cgroup_limit_panels.txt if it has no data on a
CPU-only machine or without a cgroup memory limit.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from . import recording
from .promql import matchers

DS = {"type": "prometheus", "uid": "${datasource}"}


@dataclass(frozen=True)
class Matchers:
    """The label matchers of one configuration, shared by every query below."""
    cfg: dict[str, Any]

    @property
    def chain(self) -> list[tuple[str, str, str]]:
        """(variable, label, display name) of the target variables, outermost first."""
        # rank: the ranks of a distributed job (torchrun) carry a rank label; a plain process has
        # none, and the variable's "All" (.*) matches a series without the label too
        return [*self.fleet_chain, ("pod", self.cfg["dashboards"]["pod_label"], "Pod"), ("rank", "rank", "Rank"),
                ("instance", "instance", "Instance")]

    @property
    def fleet_chain(self) -> list[tuple[str, str, str]]:
        """The target variables the fleet recording rules keep (cluster, namespace, job)."""
        return [("cluster", self.cfg["cluster_label"], "Cluster"), ("namespace", self.cfg["namespace_label"], "Namespace"),
                ("job", "job", "Job")]

    @property
    def fleet_targets(self) -> str:
        """The fleet variables as matchers: on the recorded series, and on raw series with the selector."""
        return matchers(*(f'{label}=~"${name}"' for name, label, _ in self.fleet_chain))

    @property
    def fleet_grouping(self) -> str:
        """The labels that keep fleets apart in a panel's ``by (...)``, before model and layer."""
        return ", ".join(label for _, label, _ in self.fleet_chain)

    def upto(self, variable: str | None = None) -> str:
        """The extra matchers and the target variables before ``variable`` (all of them: None)."""
        parts = [self.cfg["selector"]]
        for name, label, _ in self.chain:
            if name == variable:
                break
            parts.append(f'{label}=~"${name}"')
        return matchers(*parts)

    @property
    def base(self) -> str:
        return self.upto(None)

    @property
    def dev(self) -> str:
        return f'{self.base}, device=~"$device"'

    @property
    def layer(self) -> str:
        return f'{self.base}, model=~"$model", device=~"$device"'

    @property
    def layer_no_root(self) -> str:
        return f'{self.layer}, layer!=""'   # the root module (layer "") is the whole model

    @property
    def op(self) -> str:
        return f'{self.base}, operation=~"$operation"'


RED, ORANGE, GREEN = "red", "orange", "green"


# ---------------------------------------------------------------------------- building blocks

def target(expr: str, legend: str = "__auto", *, instant: bool = False, table: bool = False,
           exemplar: bool = False) -> dict[str, Any]:
    t: dict[str, Any] = {"datasource": DS, "expr": expr, "legendFormat": legend,
                         "range": not instant, "instant": instant}
    if table:
        t["format"] = "table"
    if exemplar:
        # the trace id of a recent request per bucket, drawn as points over the quantile lines
        t["exemplar"] = True
    return t


def thresholds(*steps: tuple[float | None, str]) -> dict[str, Any]:
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}


def _panel(kind: str, title: str, description: str, targets: list[dict[str, Any]], unit: str,
           **extra: Any) -> dict[str, Any]:
    for ref, t in zip("ABCDEFGH", targets):
        t["refId"] = ref
    p = {"type": kind, "title": title, "description": description, "datasource": DS,
         "targets": targets,
         "fieldConfig": {"defaults": {"unit": unit, "color": {"mode": "palette-classic"},
                                      "thresholds": thresholds((None, GREEN))},
                         "overrides": []}}
    p.update(extra)
    return p


def timeseries(title: str, description: str, targets: list[dict[str, Any]], unit: str, *,
               min_zero: bool = True, max_one: bool = False, log_scale: bool = False,
               threshold_steps: tuple[tuple[float | None, str], ...] = (),
               overrides: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    p = _panel("timeseries", title, description, targets, unit)
    d = p["fieldConfig"]["defaults"]
    d["custom"] = {"drawStyle": "line", "lineInterpolation": "linear", "lineWidth": 1,
                   "fillOpacity": 10, "showPoints": "never", "spanNulls": False,
                   "axisPlacement": "auto", "stacking": {"mode": "none", "group": "A"},
                   "thresholdsStyle": {"mode": "dashed" if threshold_steps else "off"}}
    if log_scale:
        d["custom"]["scaleDistribution"] = {"type": "log", "log": 10}
    elif min_zero:
        d["min"] = 0
    if max_one:
        d["max"] = 1
    if threshold_steps:
        d["thresholds"] = thresholds((None, GREEN), *threshold_steps)
    p["fieldConfig"]["overrides"] = overrides or []
    p["options"] = {"legend": {"showLegend": True, "displayMode": "table", "placement": "bottom",
                               "calcs": ["lastNotNull", "max"]},
                    "tooltip": {"mode": "multi", "sort": "desc"}}
    return p


def stat(title: str, description: str, targets: list[dict[str, Any]], unit: str, *,
         mappings: list[dict[str, Any]] | None = None,
         threshold_steps: tuple[tuple[float | None, str], ...] = (),
         color_mode: str = "value") -> dict[str, Any]:
    p = _panel("stat", title, description, targets, unit)
    d = p["fieldConfig"]["defaults"]
    d["color"] = {"mode": "thresholds"}
    d["thresholds"] = thresholds((None, GREEN), *threshold_steps)
    d["mappings"] = mappings or []
    p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "colorMode": color_mode, "graphMode": "none", "textMode": "auto",
                    "justifyMode": "auto", "orientation": "auto", "wideLayout": True}
    return p


def bargauge(title: str, description: str, targets: list[dict[str, Any]], unit: str) -> dict[str, Any]:
    p = _panel("bargauge", title, description, targets, unit)
    d = p["fieldConfig"]["defaults"]
    d["color"] = {"mode": "continuous-BlYlRd"}
    d["min"] = 0
    p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "displayMode": "gradient", "orientation": "horizontal", "valueMode": "color",
                    "showUnfilled": True, "namePlacement": "left", "sizing": "auto",
                    "minVizHeight": 16, "minVizWidth": 8, "maxVizHeight": 300}
    return p


def table(title: str, description: str, targets: list[dict[str, Any]],
          columns: dict[str, tuple[str, str]], *, hide: tuple[str, ...] = ("Time",),
          sort_by: str | None = None, red_below_one: str | None = None) -> dict[str, Any]:
    """Instant table queries merged into one row per label set. ``columns`` maps each query's
    value column ("Value #A", ...) to (display name, unit). ``red_below_one``: a column (display
    name) whose cells below 1 get a red background (a count where 0 is the bad news)."""
    p = _panel("table", title, description, targets, "none")
    p["fieldConfig"]["defaults"]["custom"] = {"align": "auto", "cellOptions": {"type": "auto"}}
    p["fieldConfig"]["overrides"] = [
        {"matcher": {"id": "byName", "options": name},
         "properties": [{"id": "unit", "value": unit}]}
        for name, unit in columns.values()]
    for o in p["fieldConfig"]["overrides"]:
        if o["matcher"]["options"] == red_below_one:
            o["properties"] += [{"id": "color", "value": {"mode": "thresholds"}},
                                {"id": "thresholds", "value": thresholds((None, RED), (1, "transparent"))},
                                {"id": "custom.cellOptions", "value": {"type": "color-background", "mode": "basic"}}]
    p["transformations"] = [
        {"id": "merge", "options": {}},
        {"id": "organize", "options": {"excludeByName": {h: True for h in hide},
                                       "renameByName": {src: name for src, (name, _) in columns.items()}}}]
    p["options"] = {"showHeader": True, "cellHeight": "sm", "footer": {"show": False},
                    "sortBy": [{"displayName": sort_by, "desc": True}] if sort_by else []}
    return p


def dashed_red(ref: str) -> dict[str, Any]:
    """Field override drawing query ``ref`` as a threshold line."""
    return {"matcher": {"id": "byFrameRefID", "options": ref},
            "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                           {"id": "custom.lineWidth", "value": 2},
                           {"id": "custom.fillOpacity", "value": 0},
                           {"id": "custom.lineInterpolation", "value": "stepAfter"},
                           {"id": "color", "value": {"mode": "fixed", "fixedColor": RED}}]}


def dashed(ref: str) -> dict[str, Any]:
    """Field override drawing query ``ref`` dashed, in its own palette colour (a prediction
    next to what was measured)."""
    return {"matcher": {"id": "byFrameRefID", "options": ref},
            "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                           {"id": "custom.fillOpacity", "value": 0}]}


def mapping(values: dict[str, tuple[str, str]]) -> list[dict[str, Any]]:
    return [{"type": "value", "options": {v: {"text": text, "color": color, "index": i}
                                          for i, (v, (text, color)) in enumerate(values.items())}}]


def query_var(name: str, label: str, query: str) -> dict[str, Any]:
    # "All" renders as .* (not a list of current values), so series of instances that appear
    # later, or only on some metrics, still match.
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "definition": query, "query": query, "refresh": 2, "sort": 1, "regex": "",
            "multi": True, "includeAll": True, "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "options": [], "hide": 0, "skipUrlSync": False}


def label_values(metric: str, where: str, label: str) -> str:
    return f"label_values({metric}{{{where}}}, {label})" if where else f"label_values({metric}, {label})"


def variables(q: Matchers, *extra: str) -> list[dict[str, Any]]:
    """The datasource, then the target variables chained (each lists the values its label has
    among the series the ones before it select), then model and device (and ``extra``: the
    operation) among the selected targets' series."""
    out: list[dict[str, Any]] = [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [],
         "refresh": 1, "regex": "", "skipUrlSync": False}]
    for name, label, title in q.chain:
        out.append(query_var(name, title, label_values("memprof_build_info", q.upto(name), label)))
    out.append(query_var("model", "Model", label_values("memprof_layer_peak_increase_bytes", q.base, "model")))
    out.append(query_var("device", "Device", label_values("memprof_allocator_allocated_bytes", q.base, "device")))
    if "operation" in extra:
        out.append(query_var("operation", "Operation",
                             label_values("memprof_operation_duration_seconds_count", q.base, "operation")))
    return out


Section = tuple[str, list[tuple[dict[str, Any], int, int]]]   # (row title, [(panel, width, height)])


def layout(sections: list[Section]) -> list[dict[str, Any]]:
    """Rows of panels, left to right, wrapping at Grafana's 24 columns; ids in order."""
    panels: list[dict[str, Any]] = []
    y = 0
    for row_title, items in sections:
        panels.append({"type": "row", "title": row_title, "collapsed": False, "panels": [],
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        y += 1
        x, row_h = 0, 0
        for panel, w, h in items:
            if x + w > 24:
                x, y, row_h = 0, y + row_h, 0
            panel["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
            panels.append(panel)
            x += w
            row_h = max(row_h, h)
        y += row_h
    for i, p in enumerate(panels, start=1):
        p["id"] = i
    return panels


def dashboard(q: Matchers, uid: str, title: str, description: str, sections: list[Section],
              extra_vars: tuple[str, ...] = (), template: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    d = q.cfg["dashboards"]
    tags = list(d["tags"])
    return {
        "uid": d["uid_prefix"] + uid, "title": d["title_prefix"] + title, "description": description,
        "tags": tags, "editable": True, "graphTooltip": 1, "schemaVersion": 39, "version": 1,
        "time": {"from": d["time_from"], "to": "now"}, "refresh": d["refresh"], "timezone": "",
        "timepicker": {}, "fiscalYearStartMonth": 0, "weekStart": "", "liveNow": False,
        "annotations": {"list": [{"builtIn": 1, "type": "dashboard", "name": "Annotations & Alerts",
                                  "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)"}]},
        "links": [{"type": "dashboards", "title": "memprof-otel", "tags": tags, "asDropdown": True,
                   "includeVars": True, "keepTime": True, "icon": "external link",
                   "targetBlank": False, "tooltip": "", "url": ""}],
        "templating": {"list": template if template is not None else variables(q, *extra_vars)},
        "panels": layout(sections),
    }


# ---------------------------------------------------------------------------- the dashboards

def overview(q: Matchers) -> dict[str, Any]:
    process: Section = ("Process", [
        (timeseries("Process resident memory",
                    "Resident set size of each instrumented process, its peak (VmHWM), and the "
                    "working set of its container (cgroup usage minus inactive file pages: every "
                    "process of the container and unreclaimable page cache; absent outside a "
                    "readable memory cgroup).",
                    [target(f"memprof_process_resident_memory_bytes{{{q.base}}}", "{{instance}} RSS"),
                     target(f"memprof_process_peak_resident_memory_bytes{{{q.base}}}", "{{instance}} peak RSS"),
                     target(f"memprof_container_memory_working_set_bytes{{{q.base}}}",
                            "{{instance}} container working set")],
                    "bytes"), 12, 8),
        (timeseries("Memory / cgroup memory limit",
                    "The container's working set (what the kernel OOM-kills on; "
                    "MemprofWorkingSetNearCgroupLimit fires above 90%) and this process's RSS, as "
                    "shares of the cgroup memory limit. Empty when the process runs without a "
                    "memory limit.",
                    [target(f"memprof_container_memory_working_set_bytes{{{q.base}}} / on(instance, job, worker) "
                            f"memprof_process_memory_limit_bytes{{{q.base}}}", "{{instance}} working set"),
                     target(f"memprof_process_resident_memory_bytes{{{q.base}}} / on(instance, job, worker) "
                            f"memprof_process_memory_limit_bytes{{{q.base}}}", "{{instance}} RSS")],
                    "percentunit", max_one=True, threshold_steps=((0.8, ORANGE), (0.9, RED))), 8, 8),
        (stat("cgroup memory limit", "The cgroup memory limit the process runs under.",
              [target(f"memprof_process_memory_limit_bytes{{{q.base}}}", "{{instance}}")], "bytes"), 4, 8),
        (timeseries("Process CPU time",
                    "CPU time per second used by the process (user + system; 100% = one core).",
                    [target(f"rate(memprof_process_cpu_seconds_total{{{q.base}}}[1m])", "{{instance}}")],
                    "percentunit"), 12, 8),
        (timeseries("Process CPU utilisation",
                    "CPU time over wall time, as a share of the container's CPU quota where one is "
                    "set (memprof_container_cpu_limit_cores, capped by the CPUs the process may run "
                    "on), else of the CPUs it may run on; at 100% the process is throttled.",
                    [target(f"memprof_process_cpu_utilization_ratio{{{q.base}}}", "{{instance}}")],
                    "percentunit", max_one=True, threshold_steps=((0.8, ORANGE), (0.95, RED))), 12, 8),
    ])
    breakdown = timeseries(
        "Where the memory goes",
        "The process's memory per device as components stacked up to the total the kernel (RSS on cpu) "
        "or the driver (NVML's per-process figure on CUDA) measures (dashed: their sum): on cpu the instrumented "
        "models' weights and KV caches, glibc's heap in use and free-but-kept, the Python object heap, "
        "file-backed pages and shared memory; on CUDA weights, KV cache, activations and other tensors, "
        "the allocator's cache and non-torch memory (CUDA context, libraries). unexplained is the total "
        "less the components. GET /v1/memory says how each was measured.",
        [target(f"memprof_memory_bytes{{{q.dev}}}", "{{instance}} {{device}} {{component}}"),
         target(f"sum by (instance, job, worker, device) (memprof_memory_bytes{{{q.dev}}})",
                "{{instance}} {{device}} total")],
        "bytes", min_zero=False, overrides=[{**dashed("B"), "properties": [
            *dashed("B")["properties"], {"id": "custom.stacking", "value": {"mode": "none", "group": "A"}}]}])
    breakdown["fieldConfig"]["defaults"]["custom"]["stacking"] = {"mode": "normal", "group": "A"}
    where: Section = ("Where the memory goes", [(breakdown, 24, 9)])
    allocator: Section = ("Allocator", [
        (timeseries("Allocator allocated / reserved",
                    "Per device: memory handed out to tensors (allocated) and memory the allocator "
                    "holds from the system (reserved; CUDA's caching allocator, glibc's arenas on CPU).",
                    [target(f"memprof_allocator_allocated_bytes{{{q.dev}}}", "{{instance}} {{device}} allocated"),
                     target(f"memprof_allocator_reserved_bytes{{{q.dev}}}", "{{instance}} {{device}} reserved")],
                    "bytes"), 12, 8),
        (timeseries("Allocator fragmentation",
                    "Inactive split blocks / reserved: memory reserved and free but cut into pieces "
                    "too small for a large request. MemprofFragmentationHigh fires above 30% with "
                    "more than 1 GiB reserved on accelerators (not for cpu: glibc's gaps are "
                    "routinely high and cannot fail a large request).",
                    [target(f"memprof_allocator_fragmentation_ratio{{{q.dev}}}", "{{instance}} {{device}}")],
                    "percentunit", max_one=True, threshold_steps=((0.3, ORANGE),)), 12, 8),
    ])
    gpu: Section = ("GPU (NVML; empty without a GPU)", [
        (timeseries("GPU memory used / total",
                    "Device memory in use by every process on the GPU, and the device's total "
                    "(exported as such: used + free is not constant).",
                    [target(f"memprof_gpu_memory_used_bytes{{{q.base}}}", "{{instance}} GPU {{gpu}} used"),
                     target(f"memprof_gpu_memory_total_bytes{{{q.base}}}", "{{instance}} GPU {{gpu}} total")],
                    "bytes", overrides=[dashed_red("B")]), 10, 8),
        (timeseries("GPU memory used share",
                    "Used / total per GPU; MemprofGpuMemoryNearFull fires above 90% for 5 minutes.",
                    [target(f"memprof_gpu_memory_used_bytes{{{q.base}}} / memprof_gpu_memory_total_bytes{{{q.base}}}",
                            "{{instance}} GPU {{gpu}}")],
                    "percentunit", max_one=True, threshold_steps=((0.8, ORANGE), (0.9, RED))), 7, 8),
        (timeseries("GPU memory used by this process",
                    "This process's share of the GPU's memory, per NVML; where NVML cannot see the "
                    "process (a pod's own PID namespace), torch's reserved bytes instead (a lower "
                    "bound: no CUDA context, no other libraries' memory).",
                    [target(f"memprof_gpu_process_memory_used_bytes{{{q.base}}} "
                            f"or memprof_gpu_process_torch_reserved_bytes{{{q.base}}}", "{{instance}} GPU {{gpu}}")],
                    "bytes"), 7, 8),
    ])
    capacity: Section = ("Capacity", [
        (timeseries("Capacity headroom",
                    "Per model and device: memory left under the limit once the predicted peak of the "
                    "largest input shape seen recently (capacity.recent_window), its fit error, what is "
                    "in use now and the margin are taken off. Below 0 (red line) that shape would not fit "
                    "now: MemprofHeadroomExhausted fires after 5 minutes, MemprofHeadroomLow when less "
                    "than one more such peak fits, for 10 minutes.",
                    [target(f"memprof_capacity_headroom_bytes{{{q.layer}}}", "{{instance}} {{model}} {{device}}")],
                    "bytes", min_zero=False, threshold_steps=((0, RED),)), 12, 8),
        (timeseries("Predicted vs measured peak (largest recent shape)",
                    "For the largest input shape seen recently: the peak increase of one forward the "
                    "memory model predicts (dashed), and the one measured (median of its attributed "
                    "forwards). Far apart: the predictions are not to be trusted (see the fit error).",
                    [target(f"memprof_capacity_predicted_peak_bytes{{{q.layer}}}",
                            "{{instance}} {{model}} {{device}} predicted"),
                     target(f"memprof_capacity_measured_peak_bytes{{{q.layer}}}",
                            "{{instance}} {{model}} {{device}} measured")],
                    "bytes", overrides=[dashed("A")]), 12, 8),
        (table("Max safe batch by sequence length",
               "Largest batch predicted to fit now, per model, device and sequence length (0: not even "
               "one), the smallest over the workers of an instance. Cap the batch your server admits "
               "at it; GET /v1/headroom answers for other shapes.",
               [target(f"min by (instance, model, device, seq_len) "
                       f"(memprof_capacity_max_safe_batch{{{q.layer}}})", instant=True, table=True)],
               {"Value": ("max safe batch", "none")}, red_below_one="max safe batch"), 8, 8),
        (timeseries("Memory model fit error",
                    "Worst relative error of each model's memory model on shapes it was not fitted on "
                    "(leave-one-shape-out); absent until enough distinct shapes have been seen. "
                    "MemprofCapacityModelInaccurate fires above 20% for 30 minutes: give the model a "
                    "shape_of function.",
                    [target(f"memprof_capacity_fit_error_ratio{{{q.layer}}}", "{{instance}} {{model}} {{device}}")],
                    "percentunit", threshold_steps=((0.2, ORANGE),)), 8, 8),
        (timeseries("Usable memory per device",
                    "Memory the forwards on each device may use: the limit named by the limit label "
                    "(cuda_device, mig, cgroup or physical) minus what other processes and this "
                    "process's non-allocator memory hold, minus the margin.",
                    [target(f"memprof_capacity_usable_bytes{{{q.dev}}}", "{{instance}} {{device}} ({{limit}})")],
                    "bytes"), 8, 8),
        (stat("Advice in force",
              "The most severe advice of each rule now, over the instances shown (memprof-otel advise "
              "--url ... or GET /v1/advice names the figures behind it and what to do; docs/advice.md "
              "explains each rule).",
              [target(f"max by (id) (memprof_advice_severity{{{q.base}}})", "{{id}}")], "none",
              mappings=mapping({"0": ("none", GREEN), "1": ("info", GREEN), "2": ("warning", ORANGE),
                                "3": ("critical", RED)}),
              threshold_steps=((2, ORANGE), (3, RED)), color_mode="background"), 24, 4),
    ])
    watchdog: Section = ("Watchdog", [
        (stat("Watchdog rules firing",
              "State of each in-process watchdog rule (config watchdog.rules): 1 while it fires.",
              [target(f"memprof_alert_active{{{q.base}}}", "{{rule}} ({{severity}})")], "none",
              mappings=mapping({"0": ("ok", GREEN), "1": ("FIRING", RED)}),
              threshold_steps=((1, RED),), color_mode="background"), 8, 6),
        (timeseries("Watchdog thresholds",
                    "Each watchdog rule's threshold in the base unit of its metric (bytes, "
                    "seconds or ratio), drawn as a threshold line; log scale, since one rule's "
                    "bytes and another's seconds differ by orders of magnitude.",
                    [target(f"memprof_watchdog_threshold{{{q.base}}}", "{{rule}} threshold")],
                    "short", log_scale=True, overrides=[dashed_red("A")]), 8, 6),
        (table("Watchdog rules",
               "Each rule with its threshold and whether it fires now.",
               [target(f"max by (rule, severity) (memprof_watchdog_threshold{{{q.base}}})", instant=True, table=True),
                target(f"max by (rule, severity) (memprof_alert_active{{{q.base}}})", instant=True, table=True)],
               {"Value #A": ("threshold", "short"), "Value #B": ("firing", "none")},
               sort_by="firing"), 8, 6),
    ])
    postmortem: Section = ("Post-mortems", [
        (stat("Post-mortems by reason",
              "Processes found ended without a clean shutdown by the process that started after them, by "
              "reason (oom_kill, killed, exited), over the instances shown: what each was doing (model, "
              "shape, layer) and its last minute of memory are at GET /v1/postmortem (memprof-otel "
              "postmortem --url ...); each is a postmortem dump too.",
              [target(f"sum by (reason) (memprof_postmortems_total{{{q.base}}})", "{{reason}}")], "none",
              threshold_steps=((1, RED),), color_mode="background"), 12, 5),
        (timeseries("Post-mortems found",
                    "Post-mortems each instance reported, by reason: a step is a restart after a kill "
                    "(MemprofPostmortem fires).",
                    [target(f"memprof_postmortems_total{{{q.base}}}", "{{instance}} {{reason}}")], "none"), 12, 5),
    ])
    self_: Section = ("memprof-otel itself", [
        (timeseries("Self overhead",
                    "Time spent inside memprof-otel's hooks per second of wall time (0.01 = 1% "
                    "of one core), averaged over 5 minutes.",
                    [target(f"rate(memprof_overhead_seconds_total{{{q.base}}}[5m])", "{{instance}}")],
                    "percentunit"), 8, 7),
        (timeseries("Sampler duration",
                    "Time one sampler pass takes; MemprofSamplerSlow fires above 500ms for 10 minutes.",
                    [target(f"memprof_sampler_duration_seconds{{{q.base}}}", "{{instance}}")],
                    "s", threshold_steps=((0.5, RED),)), 8, 7),
        (timeseries("Sampler last success age",
                    "Seconds since the sampler last succeeded; MemprofSamplerStale fires above 60s.",
                    [target(f"time() - memprof_sampler_last_success_timestamp_seconds{{{q.base}}}", "{{instance}}")],
                    "s", threshold_steps=((60, RED),)), 8, 7),
        (stat("Sources up", "Each memory source (1 = up). nvml is down on a machine without a GPU.",
              [target(f"memprof_source_up{{{q.base}}}", "{{instance}} {{source}}")], "none",
              mappings=mapping({"0": ("down", RED), "1": ("up", GREEN)}),
              threshold_steps=((1, GREEN),), color_mode="background"), 12, 5),
        (table("Build info", "memprof-otel and torch versions per instance.",
               [target(f"memprof_build_info{{{q.base}}}", instant=True, table=True)], {},
               # a single query's value column is "Value" (merged ones are "Value #A", ...)
               hide=("Time", "__name__", "Value", "Value #A")), 12, 5),
    ])
    return dashboard(q, "overview", "Overview",
                     "Process, allocator and GPU memory of processes instrumented with memprof-otel, "
                     "each model's capacity (headroom, max safe batch), watchdog state and the exporter's "
                     "own cost.",
                     [process, where, allocator, gpu, capacity, postmortem, watchdog, self_])


def layers(q: Matchers) -> dict[str, Any]:
    top: Section = ("Top layers (root module excluded)", [
        (bargauge("Top layers by peak increase",
                  "Largest peak above the level at layer entry (the layer's own transient need, "
                  "including what it freed before returning), over the last completed window.",
                  [target(f"topk(15, max by (model, layer) (memprof_layer_peak_increase_bytes{{{q.layer_no_root}}}))",
                          "{{model}} {{layer}}", instant=True)], "bytes"), 12, 10),
        (bargauge("Top layers by retained memory",
                  "Level at layer exit minus level at entry: what each layer leaves allocated.",
                  [target(f"topk(15, max by (model, layer) (memprof_layer_retained_bytes{{{q.layer_no_root}}}))",
                          "{{model}} {{layer}}", instant=True)], "bytes"), 12, 10),
    ])
    over_time: Section = ("Over time", [
        (timeseries("Per-layer peak increase",
                    "The 10 layers with the largest peak increase at each point in time.",
                    [target(f"topk(10, max by (model, layer) (memprof_layer_peak_increase_bytes{{{q.layer_no_root}}}))",
                            "{{model}} {{layer}}")], "bytes"), 12, 9),
        (timeseries("Per-layer peak allocated",
                    "Absolute allocator level at each layer's peak, for the 10 highest layers.",
                    [target(f"topk(10, max by (model, layer) (memprof_layer_peak_allocated_bytes{{{q.layer_no_root}}}))",
                            "{{model}} {{layer}}")], "bytes"), 12, 9),
        (timeseries("Per-layer mean forward time",
                    "Mean duration of one attributed forward call of each layer (10 slowest). "
                    "Attribution is sampled, so this is over the attributed calls only.",
                    [target(f"topk(10, sum by (model, layer) (rate(memprof_layer_forward_seconds_sum{{{q.layer_no_root}}}[$__rate_interval]))"
                            f" / sum by (model, layer) (rate(memprof_layer_forward_seconds_count{{{q.layer_no_root}}}[$__rate_interval])))",
                            "{{model}} {{layer}}")], "s"), 12, 9),
        (timeseries("Per-layer fragmentation (CUDA)",
                    "Mean CUDA caching-allocator fragmentation (inactive split / reserved) at the exits of "
                    "each layer's attributed calls (10 highest). CUDA layers only: CPU attribution counts "
                    "tensor storages, which have no heap layout, so CPU layers have no such series "
                    "(the Overview's allocator fragmentation shows the host heap).",
                    [target(f"topk(10, max by (model, layer) (memprof_layer_fragmentation_ratio{{{q.layer_no_root}}}))",
                            "{{model}} {{layer}}")], "percentunit", max_one=True), 12, 9),
    ])
    leaks: Section = ("Leaks", [
        (timeseries("Memory growth rate",
                    "Robust trend (Theil-Sen slope of the per-interval floor, after warm-up) of the process "
                    "RSS, each allocator's allocated bytes, and the surviving bytes of the 10 fastest-growing "
                    "layers. A sawtooth (a per-request cache) has a flat floor and a slope near 0; a leak "
                    "a steady positive one. memprof_memory_leak_suspected / memprof_layer_leak_suspected "
                    "flag the significant ones (alert MemprofMemoryLeakSuspected); GET /v1/leaks gives the "
                    "windows they were measured over.",
                    [target(f"max by (source, device) (memprof_memory_growth_bytes_per_second{{{q.base}}})",
                            "{{source}} {{device}}"),
                     target(f"topk(10, max by (model, layer) (memprof_layer_growth_bytes_per_second{{{q.layer}}}))",
                            "{{model}} {{layer}}")], "binBps", min_zero=False), 12, 9),
        (timeseries("Surviving bytes by layer",
                    "Bytes of tensors born in each layer during attributed forwards that are still alive "
                    "(10 largest). A sawtooth is a cache dropped per request; a staircase that never comes "
                    "down is something keeping what the layer made. With sampled attribution this is a "
                    "sample: about the attributed fraction of what all forwards leave.",
                    [target(f"topk(10, max by (model, layer) (memprof_layer_surviving_bytes{{{q.layer}}}))",
                            "{{model}} {{layer}}")], "bytes"), 12, 9),
    ])
    all_layers: Section = ("All layers", [
        (table("Layer memory",
               "Every exported layer (the root module, layer empty, is the whole model).",
               [target(f"max by (model, layer) (memprof_layer_peak_increase_bytes{{{q.layer}}})", instant=True, table=True),
                target(f"max by (model, layer) (memprof_layer_peak_allocated_bytes{{{q.layer}}})", instant=True, table=True),
                target(f"max by (model, layer) (memprof_layer_retained_bytes{{{q.layer}}})", instant=True, table=True)],
               {"Value #A": ("peak increase", "bytes"), "Value #B": ("peak allocated", "bytes"),
                "Value #C": ("retained", "bytes")},
               sort_by="peak increase"), 24, 12),
    ])
    deploys: Section = ("Before and after a deploy", [
        (timeseries("Per-layer peak increase by service version",
                    "The 10 layers with the largest peak increase of each version of the service "
                    "(service.version in OTEL_RESOURCE_ATTRIBUTES, the service_version label of "
                    "memprof_build_info): across a deploy the old version's line ends where the new one's "
                    "starts, and a layer whose line steps up grew. `memprof-otel diff` compares two "
                    "builds before they ship.",
                    [target(layer_by_version("memprof_layer_peak_increase_bytes", q),
                            "{{service_version}} {{model}} {{layer}}")], "bytes"), 24, 9),
    ])
    return dashboard(q, "layers", "Layers",
                     "Per-layer memory of instrumented models: each layer's transient peak, what it "
                     "retains, its absolute peak, forward time, fragmentation on CUDA, leaks "
                     "(growth rates and surviving bytes by layer), and peaks by service version.",
                     [top, over_time, leaks, all_layers, deploys])


def layer_by_version(metric: str, q: Matchers) -> str:
    """The 10 largest layers of ``metric``, labelled with the service version of their process
    (``memprof_build_info`` joined on the scrape target)."""
    # the top 10 of each version: a topk over both would leave the lines of one version out
    return (f"topk by (service_version) (10, max by (model, layer, service_version) ({metric}{{{q.layer_no_root}}}"
            f" * on (job, instance) group_left (service_version) memprof_build_info{{{q.base}}}))")


def operations(q: Matchers) -> dict[str, Any]:
    exemplars = q.cfg["dashboards"]["exemplars"]

    def quantiles(family: str) -> list[dict[str, Any]]:
        return [target(f"histogram_quantile({p}, sum by (operation, le) (rate({family}_bucket{{{q.op}}}[$__rate_interval])))",
                       f"{{{{operation}}}} p{int(p * 100)}", exemplar=exemplars) for p in (0.5, 0.95)]

    traffic: Section = ("Traffic and latency", [
        (timeseries("Operations per second",
                    "Completed operations (mp.operation blocks) per second.",
                    [target(f"sum by (operation) (rate(memprof_operation_duration_seconds_count{{{q.op}}}[$__rate_interval]))",
                            "{{operation}}")], "ops"), 12, 8),
        (timeseries("Operation duration p50 / p95",
                    "Quantiles of operation duration from the histogram's buckets.",
                    quantiles("memprof_operation_duration_seconds"), "s"), 12, 8),
    ])
    memory: Section = ("Memory per operation", [
        (timeseries("Operation memory peak p50 / p95",
                    "Quantiles of the memory peak during an operation, and its mean. The histogram's "
                    "buckets are powers of 4 from 1 MiB, so quantiles are coarse; the mean is exact.",
                    [*quantiles("memprof_operation_memory_peak_bytes"),
                     target(f"sum by (operation) (rate(memprof_operation_memory_peak_bytes_sum{{{q.op}}}[$__rate_interval]))"
                            f" / sum by (operation) (rate(memprof_operation_memory_peak_bytes_count{{{q.op}}}[$__rate_interval]))",
                            "{{operation}} mean")], "bytes"), 12, 8),
        (timeseries("Operation memory delta (last)",
                    "Memory level after the last operation minus before it; growing values point "
                    "at memory an operation keeps.",
                    [target(f"memprof_operation_memory_delta_bytes{{{q.op}}}", "{{instance}} {{operation}}")],
                    "bytes", min_zero=False), 12, 8),
    ])
    summary: Section = ("Selected range", [
        (table("Operations in the selected range",
               "Count, mean duration and p95 memory peak of each operation over the dashboard's time range.",
               [target(f"sum by (operation) (increase(memprof_operation_duration_seconds_count{{{q.op}}}[$__range]))",
                       instant=True, table=True),
                target(f"sum by (operation) (increase(memprof_operation_duration_seconds_sum{{{q.op}}}[$__range]))"
                       f" / sum by (operation) (increase(memprof_operation_duration_seconds_count{{{q.op}}}[$__range]))",
                       instant=True, table=True),
                target(f"histogram_quantile(0.95, sum by (operation, le) (increase(memprof_operation_memory_peak_bytes_bucket{{{q.op}}}[$__range])))",
                       instant=True, table=True)],
               {"Value #A": ("count", "short"), "Value #B": ("mean duration", "s"),
                "Value #C": ("p95 memory peak", "bytes")},
               sort_by="count"), 24, 8),
    ])
    return dashboard(q, "operations", "Operations",
                     "Operations marked with mp.operation(...): rate, latency and memory per operation.",
                     [traffic, memory, summary], extra_vars=("operation",))


def fleet(q: Matchers) -> dict[str, Any]:
    """Layers across the processes of a model, from the fleet recording rules (mixin/recording.py).

    A dashboard of its own: the recorded series keep cluster, namespace, job, model, layer and
    device, so its variables are those (pod and instance are folded away), and the configured
    selector was already applied by the rules. Panels group by cluster and namespace besides model
    and layer, so one model name in two namespaces is two lines even with "All" picked. Only the
    series-budget and layers-exported panels read raw per-process series (with the selector)."""
    r = q.cfg["recording"]
    w, pct = r["window"], f"p{float(r['quantile']) * 100:g}"
    rec = recording.name
    cl, ns = q.cfg["cluster_label"], q.cfg["namespace_label"]
    where = f"{cl}, {ns}"                                  # what keeps fleets apart in a panel
    at = f" {{{{{ns}}}}} {{{{{cl}}}}}"                     # legend suffix: empty without the labels
    targets = q.fleet_targets
    sel = f'{targets}, model=~"$model", device=~"$device"'
    raw = matchers(q.cfg["selector"], targets)                        # per-process series of the fleets picked
    raw_model = matchers(raw, 'model=~"$model"')
    no_root = f'{sel}, layer!=""'
    peak_max = rec("memprof_layer_peak_increase_bytes", "max")
    peak_q = rec("memprof_layer_peak_increase_bytes", "quantile")
    pods = rec("memprof_layer_peak_increase_bytes", "count")
    template = [variables(q)[0]]
    before: list[str] = []
    for name, label, title in q.fleet_chain:
        template.append(query_var(name, title, label_values(peak_max, matchers(*before), label)))
        before.append(f'{label}=~"${name}"')
    template += [query_var("model", "Model", label_values(peak_max, targets, "model")),
                 query_var("device", "Device", label_values(peak_max, f'{targets}, model=~"$model"', "device"))]
    by_layer = f"{where}, model, layer"
    top10 = f"topk(10, max by ({by_layer}) ({peak_max}{{{no_root}}}))"
    layer_legend = "{{model}} {{layer}}" + at
    layers_: Section = ("Layers across the pods of a model", [
        (bargauge("Fleet top layers by max peak increase",
                  "The 15 layers with the largest peak increase in any process of their model (the worst "
                  "pod: what a pod must be sized for), root module excluded; a model of the same name in "
                  "another namespace or cluster is another fleet.",
                  [target(f"topk(15, max by ({by_layer}) ({peak_max}{{{no_root}}}))",
                          layer_legend, instant=True)], "bytes"), 12, 10),
        (bargauge("Fleet top layers by max retained memory",
                  "The 15 layers leaving the most allocated in any process of their model, root module "
                  "excluded.",
                  [target(f"topk(15, max by ({by_layer}) ({rec('memprof_layer_retained_bytes', 'max')}{{{no_root}}}))",
                          layer_legend, instant=True)], "bytes"), 12, 10),
        (timeseries(f"Peak increase {pct} vs max across pods",
                    f"For the 10 layers with the largest max: the {pct} of the peak increase across the "
                    "processes of the model (solid) and the max (dashed). A max far above the quantile is "
                    "a few pods with other inputs or another GPU, not the model.",
                    [target(f"max by ({by_layer}) ({peak_q}{{{no_root}}})\n  and on({by_layer}) {top10}",
                            f"{layer_legend} {pct}"),
                     target(top10, f"{layer_legend} max")], "bytes", overrides=[dashed("B")]), 12, 9),
        (timeseries("Mean forward time across pods",
                    f"Mean duration of one attributed forward call of each layer over every process of the "
                    f"model ({w} rate of the summary's _sum over its _count, summed across pods first; 10 "
                    "slowest, root module excluded).",
                    [target(f"topk(10, max by ({by_layer}) ({rec('memprof_layer_forward_seconds', recording.mean_op(w))}{{{no_root}}}))",
                            layer_legend)], "s"), 12, 9),
    ])
    pods_: Section = ("Pods and series", [
        (timeseries("Pods per model",
                    "Processes exporting each model's per-layer series (each worker of a pod counts), from "
                    "the root module's count: every process exports the root module.",
                    [target(f"sum by ({where}, model, device) ({pods}{{{sel}, layer=\"\"}})",
                            "{{model}} {{device}}" + at)],
                    "short"), 12, 8),
        (timeseries("Series exported per pod vs budget",
                    "Series in each process's last /metrics answer (the 20 largest) and the configured "
                    "series.budget (dashed red). MemprofSeriesOverBudget fires when a process stays above "
                    "its budget: set series.layers: top or lower series.top_layers.",
                    [target(f"topk(20, memprof_series_exported{{{raw}}})", "{{instance}}" + at),
                     target(f"max(memprof_series_budget{{{raw}}})", "budget")],
                    "short", overrides=[dashed_red("B")]), 12, 8),
        (table("Layers tracked and exported per model",
               "Layers each model has figures for (all in /v1/layers and dumps) and how many of them the "
               "pods export per-layer series for: fewer with series.layers: top (the root, the "
               "series.top_layers largest and any leak suspect); the most is all of them on pods that "
               "export every layer (series.full_detail_fraction).",
               [target(f"max by ({where}, model) (memprof_layers_tracked{{{raw_model}}})", instant=True, table=True),
                target(f"min by ({where}, model) (memprof_layers_exported{{{raw_model}}})", instant=True, table=True),
                target(f"max by ({where}, model) (memprof_layers_exported{{{raw_model}}})", instant=True, table=True)],
               {"Value #A": ("tracked", "short"), "Value #B": ("exported (fewest)", "short"),
                "Value #C": ("exported (most)", "short")}, sort_by="tracked"), 24, 6),
    ])
    return dashboard(q, "fleet", "Fleet",
                     "Per-layer memory and forward time folded across the processes (pods) of each model "
                     f"by the fleet recording rules ({recording.LEVEL}:*), kept apart per cluster, namespace "
                     "and job; the pods per model, each process's series against its budget, and the layers "
                     "exported per model.",
                     [layers_, pods_], template=template)


DASHBOARDS = (overview, layers, operations)


def render_all(cfg: dict[str, Any]) -> dict[str, str]:
    """File name (the dashboard's uid + .json) -> JSON text of every dashboard (the Fleet one with
    the recording rules it reads)."""
    q = Matchers(cfg)
    out = {}
    for build in DASHBOARDS + ((fleet,) if cfg["recording"]["enabled"] else ()):
        d = build(q)
        out[f"{d['uid']}.json"] = json.dumps(d, indent=2, ensure_ascii=False) + "\n"
    return out
