"""The JSON Schemas of the endpoint's bodies: what the routes answer and the PUT/POST bodies they take.

They are the OpenAPI document's ``components.schemas`` (``openapi.py``); the route table
(``routes.py``) points at them with ``ref``. JSON Schema 2020-12, what OpenAPI 3.1 uses, so a client,
or the project's own tests, can validate answers against them as they are.
"""
from __future__ import annotations

from typing import Any

from ..advice import RULE_IDS, SEVERITIES
from ..advice.items import UNITS
from ..oom.cause import CAUSES
from .guards import BASELINE_FORWARDS, BASELINE_TIMEOUT, HEAP_FRAMES, HEAP_SECONDS, HEAP_TOP

OBJ = {"type": "object"}
_NUM = {"type": "number"}
_NULLABLE_NUM = {"type": ["number", "null"]}
_NULLABLE_STR = {"type": ["string", "null"]}


def ref(name: str) -> dict[str, Any]:
    """A reference to the schema ``name`` of ``component_schemas``."""
    return {"$ref": f"#/components/schemas/{name}"}


def _bounded(kind: str, limits: tuple[float, float, float], desc: str) -> dict[str, Any]:
    default, lo, hi = limits
    return {"type": kind, "minimum": lo, "maximum": hi, "default": default, "description": desc}


def component_schemas() -> dict[str, Any]:
    threshold = {"oneOf": [{"type": "number"}, {"type": "string", "maxLength": 64}],
                 "description": "a finite number, a size (20GiB) or a duration (500ms); NaN/Infinity refused"}
    return {
        "Error": {"type": "object", "required": ["error", "detail"],
                  "properties": {"error": {"type": "string"}, "detail": {"type": "string"}}},
        "Rule": {"type": "object", "required": ["name", "metric", "op", "threshold"], "properties": {
            "name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_.:-]{0,127}$"},
            "metric": {"type": "string", "pattern": "^memprof_[a-z0-9_]{1,200}$"},
            "op": {"type": "string", "enum": [">", ">=", "<", "<="]},
            "threshold": threshold,
            "for": {"oneOf": [{"type": "number", "minimum": 0, "maximum": 86400}, {"type": "string"}]},
            "severity": {"type": "string", "enum": ["info", "warning", "critical"]},
            "actions": {"type": "array", "items": {"type": "string",
                                                   "enum": ["log", "span_event", "callback", "dump"]}},
            "labels": {"type": ["object", "null"], "maxProperties": 32,
                       "additionalProperties": {"type": "string", "maxLength": 1024}}}},
        "RuleInForce": {"type": "object", "required": ["name", "metric", "op", "threshold", "for", "severity",
                                                       "actions", "labels"], "properties": {
            "name": {"type": "string"}, "metric": {"type": "string"}, "op": {"type": "string"},
            "threshold": _NUM, "for": {"type": "number", "minimum": 0}, "severity": {"type": "string"},
            "actions": {"type": "array", "items": {"type": "string"}},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}}}},
        "Rules": {"type": "object", "required": ["rules"],
                  "properties": {"rules": {"type": "array", "items": ref("RuleInForce")}}},
        "Sample": {"type": "object", "required": ["t", "process", "allocators", "gpus", "operation"], "properties": {
            "t": _NUM, "process": {"type": "object", "additionalProperties": _NULLABLE_NUM},
            "allocators": {"type": "object", "additionalProperties": {
                "type": "object", "additionalProperties": _NULLABLE_NUM}},
            "gpus": {"type": "array", "items": OBJ}, "operation": _NULLABLE_STR,
            "container": {"type": "object", "additionalProperties": _NULLABLE_NUM,
                          "description": "the process's cgroup figures (empty without a readable cgroup)"}}},
        "Operation": {"type": "object", "required": ["id", "name", "kind", "start", "end"], "properties": {
            "id": {"type": "integer"}, "name": {"type": "string"}, "kind": {"type": "string"},
            "start": _NUM, "end": _NULLABLE_NUM, "duration_seconds": _NUM,
            "memory_peak_bytes": _NUM, "memory_delta_bytes": _NUM, "memory_peak_increase_bytes": _NUM,
            "attributes": OBJ,
            "error": _NULLABLE_STR, "oom": {"type": "boolean"}}},
        "Timeline": {"type": "object", "required": ["samples", "operations", "next", "resume"], "properties": {
            "samples": {"type": "array", "items": ref("Sample")},
            "operations": {"type": "array", "items": ref("Operation")},
            "next": {**_NULLABLE_STR, "description": "cursor of the next page; null on the last"},
            "resume": {"type": "string", "description": "cursor to poll from later for newer entries"}}},
        "Dump": {"type": "object", "required": ["id", "size_bytes", "created", "kind", "model", "url"], "properties": {
            "id": {"type": "string"}, "size_bytes": {"type": "integer", "minimum": 0}, "created": _NUM,
            "kind": {"type": "string"},
            "model": {"type": "string", "description": "the model part of the id: the name with characters "
                                                       "outside A-Za-z0-9_- made _ and cut to 40 (the dump "
                                                       "request, DumpJob, carries the name itself)"},
            "url": {"type": "string"}, "cuda_snapshot": {"type": "object"}}},
        "DumpJob": {
            "type": "object", "description": "a dump request: pending, then complete (with the stored dump) or "
                                             "failed (with error and detail, as in Error)",
            "required": ["id", "status", "model", "forwards", "timeout", "created", "finished", "url", "dump",
                         "error", "detail"], "properties": {
                "id": {"type": "string", "pattern": "^job-[0-9a-f]{16}$"},
                "status": {"type": "string", "enum": ["pending", "complete", "failed"]},
                "model": {"type": "string"}, "forwards": {"type": "integer", "minimum": 1},
                "timeout": _NUM, "created": _NUM, "finished": _NULLABLE_NUM,
                "url": {"type": "string", "description": "this status (poll it)"},
                "dump": {"anyOf": [ref("Dump"), {"type": "null"}],
                         "description": "the stored dump (its url downloads it) once complete"},
                "error": {**_NULLABLE_STR, "description": "failed: no_forward_in_time, dump_not_stored, "
                                                          "uninstrumented or internal"},
                "detail": _NULLABLE_STR},
            "allOf": [
                {"if": {"properties": {"status": {"const": "pending"}}},
                 "then": {"properties": {"dump": {"type": "null"}, "error": {"type": "null"},
                                         "finished": {"type": "null"}}}},
                {"if": {"properties": {"status": {"const": "complete"}}},
                 "then": {"properties": {"dump": ref("Dump"), "finished": _NUM, "error": {"type": "null"}}}},
                {"if": {"properties": {"status": {"const": "failed"}}},
                 "then": {"properties": {"dump": {"type": "null"}, "finished": _NUM, "error": {"type": "string"},
                                         "detail": {"type": "string"}}}}]},
        "Dumps": {"type": "object", "required": ["dumps"],
                  "properties": {"dumps": {"type": "array", "items": ref("Dump")}}},
        "BaselineRequest": {"type": "object", "additionalProperties": False, "properties": {
            "model": {"type": "string", "description": "the model (may be left out when there is one)"},
            "forwards": _bounded("integer", BASELINE_FORWARDS, "model forwards to attribute and keep"),
            "timeout": _bounded("number", BASELINE_TIMEOUT, "seconds to wait for them at most")}},
        "LiveBaseline": {"type": "object", "required": ["schema", "schema_version", "model", "layers", "shapes",
                                                        "window"], "properties": {
            "schema": {"const": "memprof-otel/baseline"}, "schema_version": {"type": "integer"},
            "model": OBJ, "layers": {"type": "array"}, "forwards": {"type": "integer"},
            "shapes": {"type": "array", "items": {"type": "object", "required": ["features", "forwards", "layers"]}},
            "window": {"type": "object", "required": ["forwards_requested", "forwards_kept", "complete", "seconds",
                                                      "overhead_seconds"]}}},
        "HeapRequest": {"type": "object", "additionalProperties": False, "properties": {
            "seconds": _bounded("number", HEAP_SECONDS, "seconds to trace between the two snapshots"),
            "frames": _bounded("integer", HEAP_FRAMES, "frames kept per traceback (when tracing is "
                               "started here; a process that already traces keeps its own limit)"),
            "top": _bounded("integer", HEAP_TOP, "growing sites to answer")}},
        "HeapSite": {"type": "object", "required": ["site", "file", "line", "size_diff_bytes", "count_diff",
                                                    "size_bytes", "count", "traceback", "traceback_at_limit"],
                     "properties": {
            "site": {"type": "string", "description": "file:line of the allocating frame"},
            "file": {"type": "string"}, "line": {"type": "integer"},
            "size_diff_bytes": {"type": "integer", "description": "growth of live bytes allocated here"},
            "count_diff": {"type": "integer", "description": "growth of live blocks"},
            "size_bytes": {"type": "integer", "minimum": 0}, "count": {"type": "integer", "minimum": 0},
            "traceback": {"type": "array", "description": "oldest frame first; the last is the allocating one",
                          "items": {"type": "object", "required": ["file", "line"], "properties": {
                              "file": {"type": "string"}, "line": {"type": "integer"}}}},
            "traceback_at_limit": {"type": "boolean", "description": "as many frames as the limit: "
                                   "older frames may not have been traced"}}},
        "HeapDiff": {"type": "object", "required": [
            "seconds", "elapsed_seconds", "frames", "tracing_was_on", "stopped_early", "growth_bytes", "net_bytes",
            "traced_bytes_before", "traced_bytes_after", "sites_grown", "sites", "dump", "dump_error"], "properties": {
            "seconds": _NUM, "elapsed_seconds": _NUM, "frames": {"type": "integer", "minimum": 1},
            "tracing_was_on": {"type": "boolean", "description": "tracemalloc already traced: reused, left on"},
            "stopped_early": {"type": "boolean", "description": "the process shut down during the wait"},
            "growth_bytes": {"type": "integer", "minimum": 0}, "net_bytes": {"type": "integer"},
            "traced_bytes_before": {"type": "integer", "minimum": 0},
            "traced_bytes_after": {"type": "integer", "minimum": 0},
            "sites_grown": {"type": "integer", "minimum": 0},
            "sites": {"type": "array", "items": ref("HeapSite")},
            "dump": {"oneOf": [ref("Dump"), {"type": "null"}],
                     "description": "the stored speedscope file of the growth (null if it could not be stored)"},
            "dump_error": _NULLABLE_STR}},
        "Health": {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}},
        "Status": {"type": "object", "required": ["version", "torch_version", "models", "sources", "sampler",
                                                  "config", "started_unix"], "properties": {
            "version": {"type": "string"}, "pid": {"type": "integer", "description": "the process that answered "
                                                                        "(every answer also carries X-Memprof-Pid)"},
            "models": {"type": "array", "items": OBJ},
            "sources": OBJ, "sampler": OBJ, "config": {"type": ["object", "null"]},
            "series": {**OBJ, "description": "the series budget: series.layers, whether this host exports "
                       "every layer (and why: in_kubernetes, host_share against full_detail_fraction), the "
                       "layers each model exports (null: all), the last /metrics answer's samples, the budget"}}},
        "Layers": {"type": "object", "required": ["models"], "properties": {"models": OBJ}},
        "Trend": {"type": "object", "required": [
            "slope_bytes_per_second", "slope_low", "slope_high", "growth_bytes", "points", "window_start_unix",
            "window_end_unix", "window_seconds", "last_floor_bytes", "significant", "suspected"], "properties": {
            "slope_bytes_per_second": {**_NUM, "description": "Theil-Sen slope of the floors"},
            "slope_low": {**_NUM, "description": "lower confidence bound of the slope"},
            "slope_high": {**_NUM, "description": "upper confidence bound of the slope"},
            "growth_bytes": {**_NUM, "description": "slope times the span of the floors fitted"},
            "points": {"type": "integer", "minimum": 2}, "window_start_unix": _NUM, "window_end_unix": _NUM,
            "window_seconds": {"type": "number", "minimum": 0}, "last_floor_bytes": _NUM,
            "significant": {"type": "boolean", "description": "this fit alone passes the thresholds"},
            "suspected": {"type": "boolean", "description": "3 fits in a row have"}}},
        "WatchedSeries": {"type": "object", "required": ["source", "model", "layer", "device", "last_bytes",
                                                         "trend", "suspected"], "properties": {
            "source": {"type": "string", "enum": ["process", "allocator", "layer"]},
            "model": {"type": "string"}, "layer": {"type": "string"}, "device": {"type": "string"},
            "last_bytes": {**_NULLABLE_NUM, "description": "the reading of the last sampler tick"},
            "trend": {"oneOf": [ref("Trend"), {"type": "null"}],
                      "description": "null during warm-up and until enough floors exist"},
            "suspected": {"type": "boolean"}}},
        "Prediction": {"type": "object", "required": ["features", "peak_increase_bytes", "error_ratio", "upper_bytes",
                                                      "extrapolates", "extrapolation", "data_dependent", "shapes",
                                                      "reason"], "properties": {
            "features": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
            "peak_increase_bytes": {"type": ["integer", "null"], "description": "predicted peak above the "
                                    "forward's entry level; null when the model cannot answer (reason)"},
            "error_ratio": {"type": ["number", "null"], "description": "worst relative error on shapes left "
                            "out of the fit (inside the range seen, or outside it when this one extrapolates)"},
            "upper_bytes": {"type": ["integer", "null"], "description": "peak_increase_bytes * (1 + error_ratio)"},
            "extrapolates": {"type": "boolean"},
            "extrapolation": {"type": "object", "additionalProperties": {"type": ["number", "null"]},
                              "description": "feature -> how many times outside the range seen"},
            "extrapolation_factor": {"type": ["number", "null"], "description": "the product of extrapolation's "
                                     "factors: 1.0 inside the shapes seen; the error grows with it"},
            "data_dependent": {"type": "boolean", "description": "forwards of one shape had very different peaks"},
            "shapes": {"type": "integer"}, "reason": {"type": ["string", "null"]},
            "regime": {"type": ["string", "null"], "description": "the fit that answered (model_fit.regimes)"},
            "estimate_bytes": {"type": ["integer", "null"], "description": "the fit's figure in the limit's units, "
                               "without its error; where upper_bytes is null past capacity.max_extrapolation, a "
                               "shape whose estimate alone is over what is available does not fit"}}},
        "SafeLimit": {"type": "object", "required": ["extrapolation_factor", "error_ratio", "reason", "at_least"],
                      "properties": {
            "seq_len": {"type": ["integer", "null"]}, "batch": {"type": ["integer", "null"], "minimum": 0},
            "extrapolation_factor": {"type": ["number", "null"]}, "error_ratio": {"type": ["number", "null"]},
            "reason": {"type": ["string", "null"], "description": "why the answer is null"},
            "at_least": {"type": ["integer", "null"], "description": "known to fit, where the answer lies past "
                         "capacity.max_extrapolation"}}},
        "HeadroomModel": {"type": "object", "required": ["enabled"], "properties": {
            "enabled": {"type": "boolean"}, "reason": {"type": "string"}, "device": {"type": "string"},
            "model_fit": {"type": "object", "required": ["regimes", "error_ratio", "forwards_observed"]},
            "budget": {"type": ["object", "null"], "required": ["device", "limit", "limit_bytes", "held_elsewhere_bytes",
                                                                "in_use_bytes", "margin_bytes", "usable_bytes",
                                                                "available_bytes"], "properties": {
                "limit": {"enum": ["cuda_device", "mig", "memory_fraction", "hami", "cgroup", "physical", "configured"]}}},
            "budget_reason": {"type": ["string", "null"]},
            "shapes": {"type": "array", "items": {"type": "object", "required": [
                "features", "forwards", "peak_increase_bytes", "retained_bytes", "spread_ratio"]}},
            "shape_errors": {"type": "integer"},
            "prediction": ref("Prediction"), "fits": {"type": ["boolean", "null"]},
            "headroom_bytes": {"type": "integer"},
            "note": {"type": ["string", "null"], "description": "calls of this model give different features"},
            "max_extrapolation": {"type": "number"},
            "max_safe_batch": {"type": "object", "additionalProperties": {"type": ["integer", "null"], "minimum": 0},
                               "description": "sequence length (\"any\": a model without one) -> largest batch "
                                              "predicted to fit now; null: not known (max_safe_batch_rows says why)"},
            "max_safe_batch_rows": {"type": "array", "items": ref("SafeLimit")},
            "max_safe_batch_reason": {"type": ["string", "null"], "description": "why there are no rows"},
            "table_call": {"type": "object", "description": "which kind of call the table is about: kind "
                           "forward (every position's logits) or generate (only generate() prompts were measured: "
                           "logits of the last N positions)", "properties": {
                "kind": {"enum": ["forward", "generate"]}, "logits": {"type": ["integer", "null"]},
                "text": {"type": "string"}}},
            "max_safe_seq_len": {"allOf": [ref("SafeLimit")], "properties": {"batch": {"type": "integer"}}}}},
        "Headroom": {"type": "object", "required": ["models"], "properties": {
            "models": {"type": "object", "additionalProperties": ref("HeadroomModel")},
            "reason": {"type": "string"}}},
        "Postmortems": {"type": "object", "required": ["postmortems", "skipped_files", "scanning", "recording"],
                        "properties": {
            "postmortems": {"type": "array", "items": {
                "type": "object", "required": ["pid", "reason", "evidence", "ended_unix", "limit_bytes", "in_flight",
                                               "samples"], "properties": {
                    "pid": {"type": "integer"},
                    "reason": {"type": "string", "enum": ["oom_kill", "killed", "exited"]},
                    "evidence": {"type": "array", "items": {"type": "string", "enum": [
                        "kernel_log", "oom_kill_counter", "oom_event", "limit_reached", "exit_started",
                        "no_exit_path", "after_stop_signal"]}},
                    "ended_unix": {"type": ["number", "null"]},
                    "started_unix": {"type": ["number", "null"]},
                    "service": {"type": ["string", "null"]},
                    "host": {"type": ["string", "null"]},
                    "limit_bytes": {"type": ["integer", "null"]},
                    "near_limit": {"type": ["object", "null"]},
                    "in_flight": {"type": "array", "items": {
                        "type": "object", "required": ["model", "features", "layer", "operation"], "properties": {
                            "model": {"type": ["string", "null"]},
                            "features": {"type": "object", "additionalProperties": {"type": "integer"}},
                            "layer": {"type": "string"}, "operation": {"type": ["string", "null"]},
                            "started_unix": {"type": ["number", "null"]}, "limit_reached": {"type": "boolean"},
                            "device": {"type": "string"}, "unit": {"type": "string"},
                            "predicted_peak_bytes": {"type": "integer"}, "max_safe_batch": {"type": "integer"},
                            "start_resident_bytes": {"type": "integer"}}}},
                    "samples": {"type": "array", "items": {"type": "object", "required": ["t"],
                                                           "properties": {"t": {"type": "number"}}}},
                    "torn_slots": {"type": "integer"},
                    "cause": ref("OomCause"),
                    "sampler_interval_seconds": {"type": ["number", "null"]},
                    "window_seconds": {"type": ["number", "null"]},
                    "dump_id": {"type": ["string", "null"]}}}},
            "skipped_files": {"type": "object", "additionalProperties": {"type": "integer"}},
            "graceful_stops": {"type": "integer"},
            "scanning": {"type": "boolean"}, "recording": {"type": "boolean"},
            "dir": {"type": ["string", "null"]}, "service_key": {"type": ["string", "null"]},
            "history": {"type": "object", "properties": {
                "dir": {"type": ["string", "null"]}, "keep": {"type": "integer"}, "keep_seconds": {"type": "number"},
                "error": {"type": ["string", "null"]}}},
            "disabled_reason": {"type": ["string", "null"]}}},
        "Leaks": {"type": "object", "required": ["enabled", "suspects", "series", "top_surviving_layers",
                                                 "survivor_tables", "params"], "properties": {
            "enabled": {"type": "boolean"},
            "suspects": {"type": "array", "items": ref("WatchedSeries")},
            "series": {"type": "array", "items": ref("WatchedSeries")},
            "top_surviving_layers": {"type": "array", "items": {
                "type": "object", "required": ["model", "layer", "device", "surviving_bytes"], "properties": {
                    "model": {"type": "string"}, "layer": {"type": "string"}, "device": {"type": "string"},
                    "surviving_bytes": {"type": "integer"}}}},
            "survivor_tables": {"type": "object", "description": "per model: storages held, the bound "
                                "(leaks.max_tracked_storages), and survivors left out while it was full",
                                "additionalProperties": {
                                    "type": "object", "required": ["held", "capacity", "untracked_storages",
                                                                   "untracked_bytes"],
                                    "additionalProperties": {"type": "integer", "minimum": 0}}},
            "params": {"type": "object", "required": [
                "floor_interval_seconds", "trend_window_seconds", "warmup_seconds",
                "min_growth_rate_bytes_per_second", "min_growth_bytes", "confidence"],
                "additionalProperties": _NUM}}},
        "OomCause": {"type": "object", "required": ["cause", "summary", "knob", "figures", "missing"],
                     "description": "why an out-of-memory happened, the figures that decided it and the knob "
                                    "(docs/advice.md#oom-cause); in a post-mortem and an oom dump",
                     "properties": {
            "cause": {"type": "string", "enum": list(CAUSES)},
            "summary": {"type": "string", "description": "the cause with its figures, in human units"},
            "knob": {"type": "string", "description": "what to change"},
            "figures": {"type": "object", "required": ["device"], "description": "the known figures (bytes, "
                        "in the limit's units); an unknown one is left out", "properties": {
                "device": {"type": "string"}, "limit": {"type": "string"}, "unit": {"type": "string"},
                "features": {"type": "object", "additionalProperties": {"type": "integer"}},
                "max_safe_batch": {"type": "integer", "minimum": 0},
                "leak": {"type": "object"}, "notes": {"type": "array", "items": {"type": "string"}},
                **{k: {"type": "integer"} for k in (
                    "limit_bytes", "held_elsewhere_bytes", "static_bytes", "predicted_peak_bytes",
                    "request_rise_bytes", "requested_bytes", "reserved_free_bytes", "room_beyond_reserved_bytes",
                    "largest_free_block_bytes", "outside_bytes", "outside_baseline_bytes", "room_bytes",
                    "free_bytes", "outside_growth_bytes")}}},
            "missing": {"type": "array", "items": {"type": "string"},
                        "description": "the figures an unknown cause lacked"}}},
        "Advice": {"type": "object", "required": ["id", "severity", "title", "evidence", "action", "docs"],
                   "properties": {
            "id": {"type": "string", "enum": list(RULE_IDS), "description": "stable: what scripts match on"},
            "severity": {"type": "string", "enum": list(SEVERITIES)},
            "title": {"type": "string", "description": "one line, with the figures in human units"},
            "evidence": {"type": "object", "required": ["source", "figures"], "properties": {
                "source": {"type": "string", "description": "where the figures come from"},
                "device": {"type": "string"}, "model": {"type": "string"}, "layer": {"type": "string"},
                "cause": {"type": "string", "enum": list(CAUSES)}, "dump_id": {"type": "string"},
                "figures": {"type": "object", "minProperties": 1, "additionalProperties": {
                    "type": "object", "required": ["value", "unit"],
                    "properties": {"value": _NUM, "unit": {"type": "string", "enum": list(UNITS)}}}}}},
            "action": {"type": "string", "description": "what to do; nothing is changed for you"},
            "docs": {"type": "string", "pattern": "^docs/advice\\.md#[a-z-]+$",
                     "description": "link into the project's docs, relative to the repository root"}}},
        "AdviceReport": {"type": "object", "required": ["advice", "notes", "model", "min_severity", "checked"],
                         "properties": {
            "advice": {"type": "array", "items": ref("Advice"), "description": "most severe first"},
            "notes": {"type": "array", "items": {"type": "string"},
                      "description": "what was not measured, so some rules had nothing to check"},
            "model": _NULLABLE_STR, "min_severity": {"type": "string", "enum": list(SEVERITIES)},
            "checked": {"type": "object", "required": ["devices", "models", "rules"], "properties": {
                "devices": {"type": "array", "items": {"type": "string"}},
                "models": {"type": "array", "items": {"type": "string"}},
                "rules": {"type": "array", "items": {"type": "string"}}}}}},
        "MemoryDevice": {"type": "object", "required": [
            "total_bytes", "total_source", "age_seconds", "components", "unexplained_bytes", "unexplained_ratio",
            "measured", "other_totals", "details", "notes"], "properties": {
            "total_bytes": {"type": "integer", "minimum": 0,
                            "description": "the process's memory on the device as the outside world measures it"},
            "total_source": {"type": "string", "enum": ["rss", "nvml_process", "cuda_mem_get_info",
                                                        "allocator_reserved"]},
            "age_seconds": {"type": "number", "minimum": 0, "description": "since the sampler tick of the total"},
            "components": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0},
                           "description": "component -> bytes; they sum to total_bytes - unexplained_bytes"},
            "unexplained_bytes": {"type": "integer", "description": "total less the components (may be negative)"},
            "unexplained_ratio": _NUM,
            "measured": {"type": "object", "description": "per component: how it was measured and how old it is",
                         "additionalProperties": {"type": "object", "required": ["bytes", "source", "age_seconds"],
                                                  "properties": {"bytes": {"type": "integer"},
                                                                 "source": {"type": "string"},
                                                                 "age_seconds": {"type": "number", "minimum": 0}}}},
            "other_totals": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0},
                             "description": "other total figures (cgroup_working_set)"},
            "details": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0},
                        "description": "parts of a component (allocator_cache_fragmented)"},
            "notes": {"type": "array", "items": {"type": "string"},
                      "description": "what is not measured on this device, and where it is counted instead"}}},
        "Memory": {"type": "object", "required": ["devices", "tick_cost_seconds"], "properties": {
            "devices": {"type": "object", "additionalProperties": ref("MemoryDevice"),
                        "description": "cpu and each CUDA device (cuda:N)"},
            "tick_cost_seconds": {"type": "number", "minimum": 0,
                                  "description": "what the last breakdown cost the sampler's tick"},
            "reason": {"type": "string", "description": "why there is no device yet"}}},
        "Alerts": {"type": "object", "required": ["alerts"],
                   "properties": {"alerts": {"type": "array", "items": OBJ}}},
    }
