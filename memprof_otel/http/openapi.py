"""The OpenAPI 3 description of the endpoint (served at ``/openapi.json``)."""
from __future__ import annotations

from typing import Any

from .._version import __version__

_ERR = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_OBJ = {"application/json": {"schema": {"type": "object"}}}


def _op(summary: str, responses: dict[str, Any], params: list[dict[str, Any]] | None = None,
        body: dict[str, Any] | None = None, public: bool = False) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {
        code: (_ERR if int(code) >= 400 else {"description": desc, "content": _OBJ})
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
    auth = {"401": "missing or wrong bearer token"}
    rules_body = {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "required": ["rules"],
        "properties": {"rules": {"type": "array", "items": {"$ref": "#/components/schemas/Rule"}}}}}}}
    metrics = _op("Prometheus exposition (OpenMetrics when the Accept header asks for it)",
                  {"200": "metrics"}, public=True)
    metrics["responses"]["200"]["content"] = {"text/plain": {"schema": {"type": "string"}},
                                              "application/openmetrics-text": {"schema": {"type": "string"}}}
    return {
        "openapi": "3.0.3",
        "info": {"title": "memprof-otel endpoint", "version": __version__,
                 "description": "Per-layer PyTorch memory telemetry: metrics, alerts and on-demand dumps."},
        "paths": {
            "/metrics": {"get": metrics},
            "/healthz": {"get": _op("200 while the sampler runs, 503 with the reason otherwise",
                                    {"200": "ok", "503": "sampler down or stale"}, public=True)},
            "/v1/status": {"get": _op("version, instrumented models, sources up/down, config in force",
                                      {"200": "status", **auth})},
            "/v1/layers": {"get": _op("layer stats", {"200": "layers", "404": "unknown model", **auth},
                                      [_q("model", {"type": "string"}, "model name (all models when absent)")])},
            "/v1/timeline": {"get": _op("samples and operations", {"200": "timeline", "400": "bad since", **auth},
                                        [_q("since", {"type": "number", "minimum": 0}, "seconds back from now")])},
            "/v1/alerts": {"get": _op("alerts: pending / firing / resolved, since, value", {"200": "alerts", **auth})},
            "/v1/watchdog/rules": {
                "get": _op("the threshold rules in force", {"200": "rules", **auth}),
                "put": _op("replace the threshold rules", {"200": "rules now in force", "400": "bad rule",
                                                           "403": "no token on a non-loopback bind",
                                                           "413": "body too large", **auth}, body=rules_body)},
            "/v1/dumps": {
                "get": _op("stored dumps", {"200": "dumps", **auth}),
                "post": _op("deep-capture the next N forwards and store a speedscope file", {
                    "201": "dump stored", "400": "bad parameter", "403": "no token on a non-loopback bind",
                    "404": "unknown model", "409": "another capture runs", "504": "no forward in time",
                    "507": "dump could not be stored", **auth}, [
                    _q("kind", {"type": "string", "enum": ["speedscope"]}, "dump format"),
                    _q("forwards", {"type": "integer", "minimum": 1, "maximum": 1000}, "forwards to capture"),
                    _q("timeout", {"type": "number", "minimum": 0.01, "maximum": 600}, "seconds to wait"),
                    _q("model", {"type": "string"}, "model name (needed when several are instrumented)")])},
            "/v1/dumps/{id}": {"get": _op("download a stored dump (speedscope JSON)", {
                "200": "the dump", "400": "malformed id", "404": "no such dump", **auth},
                [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}])},
            "/openapi.json": {"get": _op("this document", {"200": "OpenAPI 3 document", **auth})},
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error", "detail"],
                          "properties": {"error": {"type": "string"}, "detail": {"type": "string"}}},
                "Rule": {"type": "object", "required": ["name", "metric", "op", "threshold"], "properties": {
                    "name": {"type": "string"}, "metric": {"type": "string", "pattern": "^memprof_[a-z0-9_]+$"},
                    "op": {"type": "string", "enum": [">", ">=", "<", "<="]},
                    "threshold": {"oneOf": [{"type": "number"}, {"type": "string"}]},
                    "for": {"oneOf": [{"type": "number"}, {"type": "string"}]},
                    "severity": {"type": "string", "enum": ["info", "warning", "critical"]},
                    "actions": {"type": "array", "items": {"type": "string",
                                                           "enum": ["log", "span_event", "callback", "dump"]}},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}}}},
            },
        },
        "security": [{"bearer": []}],
    }
