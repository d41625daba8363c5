"""The OpenAPI 3.1 description of the endpoint (served at ``/openapi.json``), written from the route
table (``routes.py``) and the body schemas (``schemas.py``).

What the router does on every route is added to each operation here, from the row's own fields,
so the document cannot leave it out: the 403 of a foreign ``Host``, the 401 of a route that needs
the token, the 403/415 of the browser guards on PUT and POST, and the 400 of a route that takes no
query parameter.
"""
from __future__ import annotations

from typing import Any

from .._version import __version__
from .routes import ROUTES, Param, Route
from .schemas import OBJ, component_schemas, ref

_ERR = {"description": "error", "content": {"application/json": {"schema": ref("Error")}}}
_NO_QUERY = {"400": "a query parameter: this route takes none"}
_TOKEN = {"401": "missing or wrong bearer token"}
_HOST = {"403": "Host not this endpoint's"}
_MUTATING = {"403": "no token on a non-loopback bind, a foreign Origin, or a Host not this endpoint's",
             "415": "Content-Type is not application/json"}


def _responses(route: Route) -> dict[str, str]:
    """The row's own answers, and those the router gives on the route before its handler runs."""
    out = dict(route.responses)
    if route.query == frozenset() and "400" not in out:
        out.update(_NO_QUERY)
    if not route.public:
        out.update(_TOKEN)
    out.update(_HOST)
    if route.mutating:
        out.update(_MUTATING)
    return out


def _parameter(p: Param) -> dict[str, Any]:
    return {"name": p.name, "in": p.where, "required": p.where == "path", "schema": p.schema,
            "description": p.description}


def _operation(route: Route) -> dict[str, Any]:
    ok = {"application/json": {"schema": route.schema or OBJ}}
    responses: dict[str, Any] = {}
    for code, desc in _responses(route).items():
        if int(code) >= 400:
            responses[code] = _ERR
            continue
        responses[code] = {"description": desc, "content": route.content.get(code, ok)}
        if code in route.headers:
            responses[code]["headers"] = route.headers[code]
    op: dict[str, Any] = {"summary": route.summary, "responses": responses}
    if route.params:
        op["parameters"] = [_parameter(p) for p in route.params]
    if route.body:
        op["requestBody"] = route.body
    if route.public:
        op["security"] = []
    return op


def openapi_document() -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {"title": "memprof-otel endpoint", "version": __version__,
                 "description": "Per-layer PyTorch memory telemetry: metrics, alerts and on-demand dumps. "
                                "PUT and POST need Content-Type: application/json."},
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": component_schemas(),
        },
        "security": [{"bearer": []}],
    }
