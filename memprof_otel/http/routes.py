"""Every route of the endpoint, once: a row per method and path.

The router (``app.Endpoint``) dispatches on this table and refuses the query names a row does not
take; the OpenAPI document (``openapi.py``) is written from it. A new route is one row here and the
handler method of ``Endpoint`` that the row names.

What every route shares is not written in the rows but derived from them, by the router and the
document alike: the ``Host`` check on every route, the bearer token on all but the ``public`` ones,
the browser guards on PUT and POST, and the 400 of a route that takes no query parameter.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from ..advice import SEVERITIES
from .guards import (DUMP_FORMATS, DUMP_WAIT_MAX, LEAKS_DEFAULT_TOP, LEAKS_MAX_TOP, MAX_NAME_CHARS,
                     TIMELINE_DEFAULT_LIMIT, TIMELINE_MAX_LIMIT)
from .schemas import ref

_MUTATING_METHODS = ("PUT", "POST")


@dataclass(frozen=True)
class Param:
    """A parameter of a route: in the query, or the path's trailing ``{name}``."""

    name: str
    schema: Mapping[str, Any]
    description: str
    where: Literal["query", "path"] = "query"


@dataclass(frozen=True)
class Route:
    """One method on one path. ``path`` may end in ``{name}``: that route answers every path under
    the part before it, and its handler is given the rest."""

    method: str
    path: str
    handler: str                  # the ``Endpoint`` method that answers
    summary: str
    responses: Mapping[str, str]  # status -> what it means; an error's body is always an Error
    params: tuple[Param, ...] = ()
    # True: the router lets every query name through, to a handler that reads or refuses them itself
    # (or to nobody: a scraper's or a probe's own parameters)
    any_query: bool = False
    public: bool = False          # answered without the bearer token
    body: Mapping[str, Any] | None = None    # the OpenAPI requestBody
    schema: Mapping[str, Any] | None = None  # the JSON of its 2xx answers (any object when None)
    content: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # status -> content, where not that JSON
    headers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # status -> headers of that answer

    @property
    def mutating(self) -> bool:
        return self.method in _MUTATING_METHODS

    @property
    def query(self) -> frozenset[str] | None:
        """The query names the router lets through (None: any): any other is a 400 naming it, so a
        typo (forward=5) is never silently ignored."""
        if self.any_query:
            return None
        return frozenset(p.name for p in self.params if p.where == "query")

    @property
    def prefix(self) -> str | None:
        """The part of a ``{name}`` path before it (None for a fixed path)."""
        return self.path[:self.path.index("{")] if "{" in self.path else None


_NAME = {"type": "string", "maxLength": MAX_NAME_CHARS}
_WAIT = Param("wait", {"type": "number", "minimum": 0, "maximum": DUMP_WAIT_MAX, "default": 0},
              f"seconds to block for the dump to finish (at most {DUMP_WAIT_MAX:g}, under common proxy timeouts)")


def _json_body(schema: Mapping[str, Any], required: bool = False) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


_LOCATION = {"Location": {"schema": {"type": "string"}, "description": "/v1/dumps/{id} of the request"}}

ROUTES: tuple[Route, ...] = (
    # scrapers and probes add parameters of their own (cache-busters): any query is taken
    Route("GET", "/metrics", "metrics",
          "Prometheus exposition (OpenMetrics when the Accept header asks for it; gzip-encoded "
          "when Accept-Encoding takes gzip)",
          {"200": "metrics"}, any_query=True, public=True,
          content={"200": {"text/plain": {"schema": {"type": "string"}},
                           "application/openmetrics-text": {"schema": {"type": "string"}}}}),
    Route("GET", "/healthz", "healthz", "200 while the sampler runs, 503 with the reason otherwise",
          {"200": "ok", "503": "sampler down or stale"}, any_query=True, public=True, schema=ref("Health")),
    Route("GET", "/v1/status", "status", "version, instrumented models, sources up/down, config in force",
          {"200": "status"}, schema=ref("Status")),
    Route("GET", "/v1/layers", "layers", "layer stats",
          {"200": "layers", "400": "bad or unknown parameter", "404": "unknown model"},
          (Param("model", _NAME, "model name (all models when absent)"),), schema=ref("Layers")),
    Route("GET", "/v1/timeline", "timeline", "samples and operations, one page at a time",
          {"200": "one page", "400": "bad since, limit or cursor, or an unknown parameter"}, (
              Param("since", {"type": "number", "minimum": 0, "maximum": 315360000}, "seconds back from now"),
              Param("limit", {"type": "integer", "minimum": 1, "maximum": TIMELINE_MAX_LIMIT,
                              "default": TIMELINE_DEFAULT_LIMIT}, "at most this many samples, and as many operations"),
              Param("cursor", _NAME, "`next` or `resume` of an earlier page")),
          schema=ref("Timeline")),
    Route("GET", "/v1/alerts", "alerts", "alerts: pending / firing / resolved, since, value", {"200": "alerts"},
          schema=ref("Alerts")),
    Route("GET", "/v1/leaks", "leaks",
          "leak suspects (process, allocators, layers), the trend of every series watched with the window it "
          "was measured over, and the layers with the most surviving bytes",
          {"200": "leaks", "400": "bad or unknown parameter"},
          (Param("top", {"type": "integer", "minimum": 1, "maximum": LEAKS_MAX_TOP, "default": LEAKS_DEFAULT_TOP},
                 "surviving layers listed"),), schema=ref("Leaks")),
    # every query name but model is a shape feature: the handler checks them
    Route("GET", "/v1/headroom", "headroom",
          "the memory model of each instrumented model: with shape features (batch, seq_len, cache_len "
          "or a shape_of's names), the predicted peak, its error, whether it extrapolates and whether it "
          "fits under the limit now; without, the largest safe batch per sequence length",
          {"200": "headroom (also before any data: each answer says why it has none)",
           "400": "a shape feature that is not a non-negative integer (bad_parameter), or one the model's "
                  "calls never gave or the question lacks (bad_shape), named", "404": "unknown model"},
          (Param("model", _NAME, "model name (all models when absent)"),
           Param("batch", {"type": "integer", "minimum": 1}, "batch size"),
           Param("seq_len", {"type": "integer", "minimum": 1}, "sequence length"),
           Param("cache_len", {"type": "integer", "minimum": 0}, "tokens already in the KV cache")),
          any_query=True, schema=ref("Headroom")),
    Route("GET", "/v1/advice", "advice",
          "advice over what was measured: each item names the figures that triggered it, what to do "
          "and its docs; nothing is changed for you",
          {"200": "the advice (an empty list with notes before any data)",
           "400": "bad parameter (min_severity) or an unknown one", "404": "unknown model"},
          (Param("model", _NAME, "only the advice about this model, the device it runs on, and the process"),
           Param("min_severity", {"type": "string", "enum": list(SEVERITIES), "default": SEVERITIES[0]},
                 "leave out advice below this severity")),
          schema=ref("AdviceReport")),
    Route("GET", "/v1/memory", "memory",
          "where the memory goes: per device, the total as the kernel or the driver measures it, its "
          "components (weights, KV cache, heaps, allocator cache...) and what is left unexplained, each "
          "with how it was measured and its age (as of the last sampler tick)",
          {"200": "the breakdown (no device before the first tick, with the reason)"}, schema=ref("Memory")),
    Route("GET", "/v1/watchdog/rules", "get_rules", "the threshold rules in force", {"200": "rules"},
          schema=ref("Rules")),
    Route("PUT", "/v1/watchdog/rules", "put_rules", "replace the threshold rules",
          {"200": "rules now in force", "400": "bad rule, or a query parameter", "413": "body too large"},
          body=_json_body({"type": "object", "required": ["rules"], "properties": {
              "rules": {"type": "array", "maxItems": 256, "items": ref("Rule")}}}, required=True),
          schema=ref("Rules")),
    Route("GET", "/v1/postmortem", "postmortem",
          "the processes of this service that ended without a clean shutdown (OOM-killed, killed, "
          "exited), read from the black box files they left: why, the evidence that decided it, the "
          "forwards in flight and the last window of sampler ticks",
          {"200": "post-mortems (an empty list when none)"}, schema=ref("Postmortems")),
    Route("GET", "/v1/dumps", "list_dumps", "stored dumps",
          {"200": "dumps", "503": "the process's own dump folder is not private (another user's, open to "
                                  "others, or a symlink): nothing is listed"},
          schema=ref("Dumps")),
    Route("POST", "/v1/dumps", "post_dump",
          "start a deep capture of the next N forwards, stored as a speedscope file; answers at once "
          "with the request (202, Location: its status) unless `wait` lets it finish (200)",
          {"200": "finished within wait: the request, complete, with the stored dump",
           "202": "pending: poll the Location (GET /v1/dumps/{id})",
           "400": "bad or unknown query parameter (named)", "404": "unknown model",
           "409": "another capture runs on the model, or its backend gives no memory figures on its device",
           "500": "failed within wait: unexpected error", "504": "failed within wait: no forward in time",
           "503": "failed within wait: monitoring is shutting down (mp.shutdown())",
           "507": "failed within wait: dump could not be stored"},
          (Param("kind", {"type": "string", "enum": ["speedscope"]}, "dump format"),
           Param("forwards", {"type": "integer", "minimum": 1, "maximum": 1000, "default": 1}, "forwards to capture"),
           Param("timeout", {"type": "number", "minimum": 0.01, "maximum": 600, "default": 30},
                 "seconds the capture waits for those forwards"),
           Param("model", _NAME, "model name (needed when several are instrumented)"),
           _WAIT),
          schema=ref("DumpJob"), headers={"200": _LOCATION, "202": _LOCATION}),
    # the body carries the parameters: the handler refuses any query, saying so
    Route("POST", "/v1/heap", "post_heap",
          "trace the Python heap (tracemalloc) for some seconds; the top growing allocation sites",
          {"200": "the growth, and the stored speedscope file", "400": "bad body field",
           "409": "another heap diff runs", "413": "body too large"},
          any_query=True, body=_json_body(ref("HeapRequest")),
          schema=ref("HeapDiff")),
    Route("POST", "/v1/baseline", "post_baseline",
          "attribute the model's next forwards (a measuring window) and answer their per-layer baseline, "
          "per input shape",
          {"200": "the baseline (what memprof-otel baseline save writes) and the window's cost",
           "400": "bad body field, or no model named where there are several", "404": "unknown model",
           "409": "another measuring window of the model is open", "413": "body too large",
           "504": "no forward ran within the timeout"},
          any_query=True,
          body=_json_body(ref("BaselineRequest")),
          schema=ref("LiveBaseline")),
    Route("GET", "/v1/dumps/{id}", "get_dump",
          "a dump request's status (id job-...), or download a stored dump (speedscope JSON, or the "
          "oom JSON, whose cause is an OomCause, or the cuda_snapshot JSON)",
          {"200": "a request that finished (complete or failed), or the stored dump's file",
           "202": "a request still pending",
           "400": "malformed id (a date that does not exist included) or one not UTF-8, bad or "
                  "unknown query parameter, format on a request id (formats apply to dump ids), "
                  "or format=pprof of a dump that is no flame graph",
           "404": "no such request or dump",
           "422": "format=pprof of a stored dump that is malformed (not JSON, nested too deep, a "
                  "frame index out of range, a negative weight)",
           "503": "the process's own dump folder is not private, or the dump cannot be read: "
                  "nothing is served"},
          (Param("id", {"type": "string", "maxLength": 80}, "a request id (job-...) or a dump id", where="path"),
           _WAIT,
           Param("format", {"type": "string", "enum": list(DUMP_FORMATS), "default": DUMP_FORMATS[0]},
                 "a flame graph (speedscope or heap dump) as stored (speedscope JSON) or as a gzipped "
                 "pprof Profile (pprof, application/octet-stream, filename <id>.pb.gz)")),
          content={"200": {"application/json": {"schema": {"anyOf": [
                       ref("DumpJob"), {"type": "object", "description": "the stored dump file"}]}},
                       "application/octet-stream": {"schema": {
                           "type": "string", "format": "binary",
                           "description": "format=pprof: a gzipped pprof Profile"}}},
                   "202": {"application/json": {"schema": ref("DumpJob")}}}),
    # cache-busters again: any query is taken
    Route("GET", "/openapi.json", "openapi", "this document", {"200": "OpenAPI 3 document"}, any_query=True),
)


def _by_path(routes: tuple[Route, ...]) -> dict[str, tuple[Route, ...]]:
    out: dict[str, list[Route]] = {}
    for r in routes:
        out.setdefault(r.path, []).append(r)
    return {p: tuple(rs) for p, rs in out.items()}


_FIXED = {p: rs for p, rs in _by_path(ROUTES).items() if rs[0].prefix is None}
_PREFIXED = tuple((rs[0].prefix or "", rs) for rs in _by_path(ROUTES).values() if rs[0].prefix is not None)


def routes_at(path: str) -> tuple[tuple[Route, ...], str]:
    """The routes that answer ``path``, one per method (none: no such path), and the part of it a
    ``{name}`` took ("" on a fixed path). Under a ``{name}`` route any rest is taken, even ``../x``
    decoded from %2F: the handler's own check of it refuses what is not an id."""
    for prefix, routes in _PREFIXED:
        if path.startswith(prefix):
            return routes, path[len(prefix):]
    return _FIXED.get(path, ()), ""
