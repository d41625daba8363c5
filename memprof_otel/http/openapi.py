"""The OpenAPI 3.1 description of the endpoint (served at ``/openapi.json``).

Response schemas are JSON Schema 2020-12 (what OpenAPI 3.1 uses), so a client, or the project's own
tests, can validate answers against them as they are.
"""
from __future__ import annotations

from typing import Any

from .._version import __version__
from .guards import LEAKS_DEFAULT_TOP, LEAKS_MAX_TOP, TIMELINE_DEFAULT_LIMIT, TIMELINE_MAX_LIMIT

_ERR = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_OBJ = {"type": "object"}
_NUM = {"type": "number"}
_NULLABLE_NUM = {"type": ["number", "null"]}
_NULLABLE_STR = {"type": ["string", "null"]}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _op(summary: str, responses: dict[str, Any], params: list[dict[str, Any]] | None = None,
        body: dict[str, Any] | None = None, public: bool = False,
        schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """One operation; ``schema`` describes the JSON of its 2xx answer."""
    ok = {"application/json": {"schema": schema or _OBJ}}
    op: dict[str, Any] = {"summary": summary, "responses": {
        code: (_ERR if int(code) >= 400 else {"description": desc, "content": ok})
        for code, desc in responses.items()}}
    if params:
        op["parameters"] = params
    if body:
        op["requestBody"] = body
    if public:
        op["security"] = []
    return op


def _q(name: str, schema: dict[str, Any], desc: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": desc}


def _schemas() -> dict[str, Any]:
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
                  "properties": {"rules": {"type": "array", "items": _ref("RuleInForce")}}},
        "Sample": {"type": "object", "required": ["t", "process", "allocators", "gpus", "operation"], "properties": {
            "t": _NUM, "process": {"type": "object", "additionalProperties": _NULLABLE_NUM},
            "allocators": {"type": "object", "additionalProperties": {
                "type": "object", "additionalProperties": _NULLABLE_NUM}},
            "gpus": {"type": "array", "items": _OBJ}, "operation": _NULLABLE_STR}},
        "Operation": {"type": "object", "required": ["id", "name", "kind", "start", "end"], "properties": {
            "id": {"type": "integer"}, "name": {"type": "string"}, "kind": {"type": "string"},
            "start": _NUM, "end": _NULLABLE_NUM, "duration_seconds": _NUM,
            "memory_peak_bytes": _NUM, "memory_delta_bytes": _NUM, "attributes": _OBJ,
            "error": _NULLABLE_STR, "oom": {"type": "boolean"}}},
        "Timeline": {"type": "object", "required": ["samples", "operations", "next", "resume"], "properties": {
            "samples": {"type": "array", "items": _ref("Sample")},
            "operations": {"type": "array", "items": _ref("Operation")},
            "next": {**_NULLABLE_STR, "description": "cursor of the next page; null on the last"},
            "resume": {"type": "string", "description": "cursor to poll from later for newer entries"}}},
        "Dump": {"type": "object", "required": ["id", "size_bytes", "created", "kind", "model", "url"], "properties": {
            "id": {"type": "string"}, "size_bytes": {"type": "integer", "minimum": 0}, "created": _NUM,
            "kind": {"type": "string"}, "model": {"type": "string"}, "url": {"type": "string"},
            "cuda_snapshot": {"type": "object"}}},
        "Dumps": {"type": "object", "required": ["dumps"],
                  "properties": {"dumps": {"type": "array", "items": _ref("Dump")}}},
        "Health": {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}},
        "Status": {"type": "object", "required": ["version", "torch_version", "models", "sources", "sampler",
                                                  "config", "started_unix"], "properties": {
            "version": {"type": "string"}, "models": {"type": "array", "items": _OBJ},
            "sources": _OBJ, "sampler": _OBJ, "config": {"type": ["object", "null"]}}},
        "Layers": {"type": "object", "required": ["models"], "properties": {"models": _OBJ}},
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
            "trend": {"oneOf": [_ref("Trend"), {"type": "null"}],
                      "description": "null during warm-up and until enough floors exist"},
            "suspected": {"type": "boolean"}}},
        "Leaks": {"type": "object", "required": ["enabled", "suspects", "series", "top_surviving_layers",
                                                 "survivor_tables", "params"], "properties": {
            "enabled": {"type": "boolean"},
            "suspects": {"type": "array", "items": _ref("WatchedSeries")},
            "series": {"type": "array", "items": _ref("WatchedSeries")},
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
        "Alerts": {"type": "object", "required": ["alerts"],
                   "properties": {"alerts": {"type": "array", "items": _OBJ}}},
    }


def openapi_document() -> dict[str, Any]:
    auth = {"401": "missing or wrong bearer token", "403": "Host not this endpoint's"}
    mutating = {"403": "no token on a non-loopback bind, a foreign Origin, or a Host not this endpoint's",
                "415": "Content-Type is not application/json"}
    rules_body = {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "required": ["rules"],
        "properties": {"rules": {"type": "array", "maxItems": 256, "items": _ref("Rule")}}}}}}
    metrics = _op("Prometheus exposition (OpenMetrics when the Accept header asks for it)",
                  {"200": "metrics", "403": "Host not this endpoint's"}, public=True)
    metrics["responses"]["200"]["content"] = {"text/plain": {"schema": {"type": "string"}},
                                              "application/openmetrics-text": {"schema": {"type": "string"}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "memprof-otel endpoint", "version": __version__,
                 "description": "Per-layer PyTorch memory telemetry: metrics, alerts and on-demand dumps. "
                                "PUT and POST need Content-Type: application/json."},
        "paths": {
            "/metrics": {"get": metrics},
            "/healthz": {"get": _op("200 while the sampler runs, 503 with the reason otherwise",
                                    {"200": "ok", "403": "Host not this endpoint's", "503": "sampler down or stale"},
                                    public=True, schema=_ref("Health"))},
            "/v1/status": {"get": _op("version, instrumented models, sources up/down, config in force",
                                      {"200": "status", **auth}, schema=_ref("Status"))},
            "/v1/layers": {"get": _op("layer stats", {"200": "layers", "400": "bad parameter", "404": "unknown model",
                                                      **auth},
                                      [_q("model", {"type": "string", "maxLength": 256},
                                          "model name (all models when absent)")], schema=_ref("Layers"))},
            "/v1/timeline": {"get": _op("samples and operations, one page at a time",
                                        {"200": "one page", "400": "bad since, limit or cursor", **auth}, [
                _q("since", {"type": "number", "minimum": 0, "maximum": 315360000}, "seconds back from now"),
                _q("limit", {"type": "integer", "minimum": 1, "maximum": TIMELINE_MAX_LIMIT,
                             "default": TIMELINE_DEFAULT_LIMIT}, "at most this many samples, and as many operations"),
                _q("cursor", {"type": "string", "maxLength": 256}, "`next` or `resume` of an earlier page")],
                schema=_ref("Timeline"))},
            "/v1/alerts": {"get": _op("alerts: pending / firing / resolved, since, value", {"200": "alerts", **auth},
                                      schema=_ref("Alerts"))},
            "/v1/leaks": {"get": _op("leak suspects (process, allocators, layers), the trend of every series "
                                     "watched with the window it was measured over, and the layers with "
                                     "the most surviving bytes", {"200": "leaks", "400": "bad parameter", **auth},
                                     [_q("top", {"type": "integer", "minimum": 1, "maximum": LEAKS_MAX_TOP,
                                                 "default": LEAKS_DEFAULT_TOP},
                                         "surviving layers listed")], schema=_ref("Leaks"))},
            "/v1/watchdog/rules": {
                "get": _op("the threshold rules in force", {"200": "rules", **auth}, schema=_ref("Rules")),
                "put": _op("replace the threshold rules", {"200": "rules now in force", "400": "bad rule",
                                                           "413": "body too large", **auth, **mutating},
                           body=rules_body, schema=_ref("Rules"))},
            "/v1/dumps": {
                "get": _op("stored dumps", {"200": "dumps", **auth}, schema=_ref("Dumps")),
                "post": _op("deep-capture the next N forwards and store a speedscope file", {
                    "201": "dump stored", "400": "bad parameter", "404": "unknown model",
                    "409": "another capture runs", "504": "no forward in time",
                    "507": "dump could not be stored", **auth, **mutating}, [
                    _q("kind", {"type": "string", "enum": ["speedscope"]}, "dump format"),
                    _q("forwards", {"type": "integer", "minimum": 1, "maximum": 1000}, "forwards to capture"),
                    _q("timeout", {"type": "number", "minimum": 0.01, "maximum": 600}, "seconds to wait"),
                    _q("model", {"type": "string", "maxLength": 256},
                       "model name (needed when several are instrumented)")], schema=_ref("Dump"))},
            "/v1/dumps/{id}": {"get": _op("download a stored dump (speedscope JSON)", {
                "200": "the dump", "400": "malformed id", "404": "no such dump", **auth},
                [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}])},
            "/openapi.json": {"get": _op("this document", {"200": "OpenAPI 3 document", **auth})},
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": _schemas(),
        },
        "security": [{"bearer": []}],
    }
