"""The OpenAPI 3.1 description of the endpoint (served at ``/openapi.json``).

The schemas of the bodies are ``schemas.py``'s, JSON Schema 2020-12 (what OpenAPI 3.1 uses).
"""
from __future__ import annotations

from typing import Any

from .._version import __version__
from ..advice import SEVERITIES
from .guards import (DUMP_FORMATS, DUMP_WAIT_MAX, LEAKS_DEFAULT_TOP, LEAKS_MAX_TOP, TIMELINE_DEFAULT_LIMIT,
                     TIMELINE_MAX_LIMIT)
from .schemas import OBJ as _OBJ, component_schemas, ref as _ref

_ERR = {"description": "error", "content": {"application/json": {"schema": _ref("Error")}}}


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


def openapi_document() -> dict[str, Any]:
    auth = {"401": "missing or wrong bearer token", "403": "Host not this endpoint's"}
    no_query = {"400": "a query parameter: this route takes none"}
    mutating = {"403": "no token on a non-loopback bind, a foreign Origin, or a Host not this endpoint's",
                "415": "Content-Type is not application/json"}
    rules_body = {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "required": ["rules"],
        "properties": {"rules": {"type": "array", "maxItems": 256, "items": _ref("Rule")}}}}}}
    metrics = _op("Prometheus exposition (OpenMetrics when the Accept header asks for it; gzip-encoded "
                  "when Accept-Encoding takes gzip)",
                  {"200": "metrics", "403": "Host not this endpoint's"}, public=True)
    metrics["responses"]["200"]["content"] = {"text/plain": {"schema": {"type": "string"}},
                                              "application/openmetrics-text": {"schema": {"type": "string"}}}
    wait = _q("wait", {"type": "number", "minimum": 0, "maximum": DUMP_WAIT_MAX, "default": 0},
              f"seconds to block for the dump to finish (at most {DUMP_WAIT_MAX:g}, under common proxy timeouts)")
    dump_post = _op("start a deep capture of the next N forwards, stored as a speedscope file; answers at once "
                    "with the request (202, Location: its status) unless `wait` lets it finish (200)", {
                        "200": "finished within wait: the request, complete, with the stored dump",
                        "202": "pending: poll the Location (GET /v1/dumps/{id})",
                        "400": "bad or unknown query parameter (named)", "404": "unknown model", "409": "another capture runs on the model, or its backend gives no memory figures on its device",
                        "500": "failed within wait: unexpected error", "504": "failed within wait: no forward in time",
                        "503": "failed within wait: monitoring is shutting down (mp.shutdown())",
                        "507": "failed within wait: dump could not be stored", **auth, **mutating}, [
        _q("kind", {"type": "string", "enum": ["speedscope"]}, "dump format"),
        _q("forwards", {"type": "integer", "minimum": 1, "maximum": 1000, "default": 1}, "forwards to capture"),
        _q("timeout", {"type": "number", "minimum": 0.01, "maximum": 600, "default": 30},
           "seconds the capture waits for those forwards"),
        _q("model", {"type": "string", "maxLength": 256}, "model name (needed when several are instrumented)"),
        wait], schema=_ref("DumpJob"))
    dump_post["responses"]["202"]["headers"] = dump_post["responses"]["200"]["headers"] = {
        "Location": {"schema": {"type": "string"}, "description": "/v1/dumps/{id} of the request"}}
    dump_get = _op("a dump request's status (id job-...), or download a stored dump (speedscope JSON, or the "
                   "oom JSON, whose cause is an OomCause, or the cuda_snapshot JSON)", {
                       "200": "a request that finished (complete or failed), or the stored dump's file",
                       "202": "a request still pending",
                       "400": "malformed id (a date that does not exist included) or one not UTF-8, bad or "
                              "unknown query parameter, format on a request id (formats apply to dump ids), "
                              "or format=pprof of a dump that is no flame graph",
                       "404": "no such request or dump",
                       "422": "format=pprof of a stored dump that is malformed (not JSON, nested too deep, a "
                              "frame index out of range, a negative weight)",
                       "503": "the process's own dump folder is not private, or the dump cannot be read: "
                              "nothing is served", **auth},
                   [{"name": "id", "in": "path", "required": True,
                     "schema": {"type": "string", "maxLength": 80},
                     "description": "a request id (job-...) or a dump id"}, wait,
                    _q("format", {"type": "string", "enum": list(DUMP_FORMATS), "default": DUMP_FORMATS[0]},
                       "a flame graph (speedscope or heap dump) as stored (speedscope JSON) or as a gzipped "
                       "pprof Profile (pprof, application/octet-stream, filename <id>.pb.gz)")])
    dump_get["responses"]["200"]["content"] = {
        "application/json": {"schema": {"anyOf": [
            _ref("DumpJob"), {"type": "object", "description": "the stored dump file"}]}},
        "application/octet-stream": {"schema": {"type": "string", "format": "binary",
                                                "description": "format=pprof: a gzipped pprof Profile"}}}
    dump_get["responses"]["202"]["content"] = {"application/json": {"schema": _ref("DumpJob")}}
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
                                      {"200": "status", **no_query, **auth}, schema=_ref("Status"))},
            "/v1/layers": {"get": _op("layer stats", {"200": "layers", "400": "bad or unknown parameter", "404": "unknown model",
                                                      **auth},
                                      [_q("model", {"type": "string", "maxLength": 256},
                                          "model name (all models when absent)")], schema=_ref("Layers"))},
            "/v1/timeline": {"get": _op("samples and operations, one page at a time",
                                        {"200": "one page", "400": "bad since, limit or cursor, or an unknown parameter", **auth}, [
                _q("since", {"type": "number", "minimum": 0, "maximum": 315360000}, "seconds back from now"),
                _q("limit", {"type": "integer", "minimum": 1, "maximum": TIMELINE_MAX_LIMIT,
                             "default": TIMELINE_DEFAULT_LIMIT}, "at most this many samples, and as many operations"),
                _q("cursor", {"type": "string", "maxLength": 256}, "`next` or `resume` of an earlier page")],
                schema=_ref("Timeline"))},
            "/v1/alerts": {"get": _op("alerts: pending / firing / resolved, since, value", {"200": "alerts", **no_query, **auth},
                                      schema=_ref("Alerts"))},
            "/v1/leaks": {"get": _op("leak suspects (process, allocators, layers), the trend of every series "
                                     "watched with the window it was measured over, and the layers with "
                                     "the most surviving bytes", {"200": "leaks", "400": "bad or unknown parameter", **auth},
                                     [_q("top", {"type": "integer", "minimum": 1, "maximum": LEAKS_MAX_TOP,
                                                 "default": LEAKS_DEFAULT_TOP},
                                         "surviving layers listed")], schema=_ref("Leaks"))},
            "/v1/headroom": {"get": _op(
                "the memory model of each instrumented model: with shape features (batch, seq_len, cache_len "
                "or a shape_of's names), the predicted peak, its error, whether it extrapolates and whether it "
                "fits under the limit now; without, the largest safe batch per sequence length",
                {"200": "headroom (also before any data: each answer says why it has none)",
                 "400": "a shape feature that is not a non-negative integer (bad_parameter), or one the model's "
                        "calls never gave or the question lacks (bad_shape), named", "404": "unknown model", **auth},
                [_q("model", {"type": "string", "maxLength": 256}, "model name (all models when absent)"),
                 _q("batch", {"type": "integer", "minimum": 1}, "batch size"),
                 _q("seq_len", {"type": "integer", "minimum": 1}, "sequence length"),
                 _q("cache_len", {"type": "integer", "minimum": 0}, "tokens already in the KV cache")],
                schema=_ref("Headroom"))},
            "/v1/advice": {"get": _op(
                "advice over what was measured: each item names the figures that triggered it, what to do "
                "and its docs; nothing is changed for you", {
                    "200": "the advice (an empty list with notes before any data)",
                    "400": "bad parameter (min_severity) or an unknown one", "404": "unknown model", **auth}, [
                    _q("model", {"type": "string", "maxLength": 256},
                       "only the advice about this model, the device it runs on, and the process"),
                    _q("min_severity", {"type": "string", "enum": list(SEVERITIES), "default": SEVERITIES[0]},
                       "leave out advice below this severity")], schema=_ref("AdviceReport"))},
            "/v1/memory": {"get": _op(
                "where the memory goes: per device, the total as the kernel or the driver measures it, its "
                "components (weights, KV cache, heaps, allocator cache...) and what is left unexplained, each "
                "with how it was measured and its age (as of the last sampler tick)",
                {"200": "the breakdown (no device before the first tick, with the reason)", **no_query, **auth},
                schema=_ref("Memory"))},
            "/v1/watchdog/rules": {
                "get": _op("the threshold rules in force", {"200": "rules", **no_query, **auth}, schema=_ref("Rules")),
                "put": _op("replace the threshold rules", {"200": "rules now in force", "400": "bad rule, or a query parameter",
                                                           "413": "body too large", **auth, **mutating},
                           body=rules_body, schema=_ref("Rules"))},
            "/v1/postmortem": {"get": _op(
                "the processes of this service that ended without a clean shutdown (OOM-killed, killed, "
                "exited), read from the black box files they left: why, the evidence that decided it, the "
                "forwards in flight and the last window of sampler ticks",
                {"200": "post-mortems (an empty list when none)", **no_query, **auth}, schema=_ref("Postmortems"))},
            "/v1/dumps": {
                "get": _op("stored dumps", {"200": "dumps", **no_query, **auth,
                                            "503": "the process's own dump folder is not private (another "
                                                   "user's, open to others, or a symlink): nothing is listed"},
                           schema=_ref("Dumps")),
                "post": dump_post},
            "/v1/heap": {"post": _op(
                "trace the Python heap (tracemalloc) for some seconds; the top growing allocation sites", {
                    "200": "the growth, and the stored speedscope file", "400": "bad body field",
                    "409": "another heap diff runs", "413": "body too large", **auth, **mutating},
                body={"required": False, "content": {"application/json": {"schema": _ref("HeapRequest")}}},
                schema=_ref("HeapDiff"))},
            "/v1/baseline": {"post": _op(
                "attribute the model's next forwards (a measuring window) and answer their per-layer baseline, "
                "per input shape", {
                    "200": "the baseline (what memprof-otel baseline save writes) and the window's cost",
                    "400": "bad body field, or no model named where there are several", "404": "unknown model",
                    "409": "another measuring window of the model is open", "413": "body too large",
                    "504": "no forward ran within the timeout", **auth, **mutating},
                body={"required": False, "content": {"application/json": {"schema": _ref("BaselineRequest")}}},
                schema=_ref("LiveBaseline"))},
            "/v1/dumps/{id}": {"get": dump_get},
            "/openapi.json": {"get": _op("this document", {"200": "OpenAPI 3 document", **auth})},
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": component_schemas(),
        },
        "security": [{"bearer": []}],
    }
