"""The HTTP endpoint's routes as one transport-free function: ``Endpoint.handle(Request) -> Response``.

The server (``http.server.serve``) and the WSGI/ASGI apps only translate to and from these two
types. Every error is JSON ``{"error", "detail"}`` with a 4xx code for bad input; an unexpected
failure is a 500 with the exception's type, never a traceback.

Which routes exist, the handler method each calls and the query names each takes are the table of
``routes.py``; this module dispatches on it and holds the handlers.

Requests from other origins are checked before any route runs (see ``host_allowed`` and
``_guard_browser``): a ``Host`` that is not this endpoint's (DNS rebinding) is refused on every route,
and PUT/POST need ``Content-Type: application/json`` and no foreign ``Origin``, so a web page can
neither send a "simple" cross-origin request nor read an answer through a rebound name.
"""
from __future__ import annotations

import gzip
import hmac
import os
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol
from urllib.parse import parse_qs


from .._log import rate_limited
from ..advice import SEVERITIES
from ..advice.service import Advisor
from .._version import __version__
from ..config import Config, ConfigError, HttpConfig, LeaksConfig
from ..errors import (CaptureBusy, CaptureUnsupported, DumpNotFound, ExportError, InstrumentationError, InvalidDumpId, ModelRequired, ShapeError, UnknownModel)
from ..attribution.live_handles import live_handles
from ..blackbox.service import BlackBox
from ..baselines import from_shapes
from ..dumps.jobs import FAILED, JOB_ID_RE, PENDING, DumpJob
from ..dumps.flame import MalformedDump, flame_from_stored
from ..dumps.heap_session import HeapProfiler
from ..dumps.pprof import build_pprof
from ..dumps.service import DumpService
from ..dumps.store import is_dump_id
from ..files import json_bytes
from ..export.exposition_merge import OPENMETRICS
from ..export.prometheus import count_samples, make_registry, render_exposition
from ..export.worker_snapshots import render_all_workers, stale_after_s
from ..sources import registry
from ..telemetry.breakdown_service import MemoryBreakdownWatch
from ..telemetry.leaks import LeakWatch
from ..telemetry.operations import OperationTracker
from ..telemetry.sampler import Sampler
from ..telemetry.scrape import ScrapeView
from ..telemetry.self_counters import SelfCounters
from ..watchdog.service import Watchdog
from ..watchdog.rules import MAX_RULES, parse_rule
from .guards import (BASELINE_FORWARDS, BASELINE_TIMEOUT, DUMP_FORMATS, DUMP_WAIT_MAX, HEAP_FRAMES, HEAP_SECONDS, HEAP_TOP, JSON, LEAKS_DEFAULT_TOP, LEAKS_MAX_TOP,
                     MAX_NAME_CHARS, TIMELINE_DEFAULT_LIMIT, TIMELINE_MAX_BYTES, TIMELINE_MAX_LIMIT, accepts_gzip,
                     host_allowed, is_loopback, json_number, make_cursor, media_type, parse_cursor, parse_integer,
                     parse_number)
from .openapi import openapi_document
from .routes import ROUTES, routes_at

MAX_SHAPE_FEATURES = 6  # the memory model's own bound (capacity.shapes.MAX_FEATURES)
MAX_SHAPE_VALUE = 1 << 30

PID_HEADER = "X-Memprof-Pid"  # on every answer: the pid of the process that gave it
# gzip level of /metrics: 1 (fastest), as Go's promhttp. Level 9 makes a 1,000-layer scrape 16 %
# smaller still, for 7x the compression time on the model's process (docs/benchmarks.md)
GZIP_LEVEL = 1
_ITEMS_PER_SLICE = 32      # items encoded between two yields of the interpreter (see _encode_slice)
# a failed dump job's error code -> the status a POST that waited for it answers
_FAILED_STATUS = {"no_forward_in_time": 504, "dump_not_stored": 507, "uninstrumented": 409, "shutting_down": 503,
                  "capture_unsupported": 409, "capture_in_progress": 409, "unknown_model": 404}


class EndpointServices(Protocol):
    """What the routes read and drive (the process runtime is one; the composition root passes it)."""

    config: Config | None
    sampler: Sampler | None
    tracker: OperationTracker
    watchdog: Watchdog | None
    leaks: LeakWatch | None
    dump_service: DumpService
    heap: HeapProfiler
    blackbox: BlackBox
    started_unix: float
    servers: list[Any]
    scrape: ScrapeView        # the series, layer views and the series budget (/metrics, /v1/status)
    counters: SelfCounters    # where the server counts failed connections
    advisor: Advisor          # /v1/advice
    memory: MemoryBreakdownWatch  # /v1/memory

    def ensure_started(self, config: Config | None = None) -> Any: ...
    def samples(self, since_unix: float | None = None) -> list[Any]: ...


@dataclass
class Request:
    method: str
    path: str
    query: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names
    body: bytes = b""
    client: str = ""


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = JSON
    headers: dict[str, str] = field(default_factory=dict)


class HttpError(Exception):
    def __init__(self, status: int, error: str, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.error, self.detail = status, error, detail
        self.headers = headers or {}


def json_response(status: int, obj: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(status, dumps(obj), JSON, headers or {})


# compact strict JSON; a NaN or infinity that reached a response (a source reading, say) is sent as
# null: strict JSON has no such numbers, and a read route must not fail over one value
dumps = json_bytes


def error_response(status: int, error: str, detail: str, headers: dict[str, str] | None = None) -> Response:
    return json_response(status, {"error": error, "detail": detail}, headers)


def _shown(v: str, limit: int = 40) -> str:
    """``repr`` cut short, so an error never echoes a long hostile string back."""
    r = repr(v)
    return r if len(r) <= limit else r[:limit] + "..."


def _float_param(q: Mapping[str, list[str]], name: str, default: float | None, lo: float, hi: float) -> float | None:
    raw = q.get(name)
    if raw is None:
        return default
    v = parse_number(raw[-1], lo, hi)
    if v is None:
        raise HttpError(400, "bad_parameter",
                        f"{name} must be a finite number between {lo:g} and {hi:g}, got {_shown(raw[-1])}")
    return v


def _int_param(q: Mapping[str, list[str]], name: str, default: int, lo: int, hi: int) -> int:
    raw = q.get(name)
    if raw is None:
        return default
    v = parse_integer(raw[-1], lo, hi)
    if v is None:
        raise HttpError(400, "bad_parameter", f"{name} must be an integer between {lo} and {hi}, "
                        f"got {_shown(raw[-1])}")
    return v


def _str_param(q: Mapping[str, list[str]], name: str) -> str | None:
    raw = q.get(name)
    if raw is None or raw[-1] == "":
        return None
    if len(raw[-1]) > MAX_NAME_CHARS:
        raise HttpError(400, "bad_parameter", f"{name} must be at most {MAX_NAME_CHARS} characters")
    return raw[-1]


def _shape_features(q: Mapping[str, list[str]]) -> dict[str, int]:
    """The shape features of a ``/v1/headroom`` query: non-negative integers, 400 naming the field."""
    out: dict[str, int] = {}
    for name, raw in q.items():
        if name == "model":
            continue
        if not name.isidentifier() or len(name) > 64:
            raise HttpError(400, "bad_parameter", f"{_shown(name)} is not a shape feature name")
        if len(out) >= MAX_SHAPE_FEATURES:
            raise HttpError(400, "bad_parameter", f"at most {MAX_SHAPE_FEATURES} shape features")
        v = parse_integer(raw[-1], 0, MAX_SHAPE_VALUE)
        if v is None:
            raise HttpError(400, "bad_parameter", f"{name} must be an integer between 0 and {MAX_SHAPE_VALUE}, "
                            f"got {_shown(raw[-1])}")
        out[name] = v
    return out


def _json_body(req: Request) -> Any:
    """The request body as JSON (an empty body is ``None``); 400 ``bad_json`` otherwise."""
    try:
        return json.loads(req.body) if req.body else None
    except (ValueError, UnicodeDecodeError) as e:
        raise HttpError(400, "bad_json", f"body is not JSON: {str(e)[:200]}") from None
    except RecursionError:  # nested deeper than the parser goes
        raise HttpError(400, "bad_json", "body is not JSON: nested too deep") from None


def _body_fields(req: Request, q: Mapping[str, list[str]], route: str, fields: tuple[str, ...],
                 example: str) -> dict[str, Any]:
    """A POST's JSON object body of the named ``fields`` (an empty body: none); a query, another
    JSON value or another field is a 400 naming what to send instead."""
    if q:
        raise HttpError(400, "bad_parameter", f"{route} takes its parameters in a JSON body, "
                        f"e.g. {example}, not in the query")
    doc = _json_body(req)
    doc = {} if doc is None else doc
    if not isinstance(doc, dict):
        raise HttpError(400, "bad_body", f"the body must be a JSON object such as {example}")
    unknown = sorted(set(doc) - set(fields))
    if unknown:
        raise HttpError(400, "bad_parameter", f"unknown field {_shown(unknown[0])}; "
                        f"the fields are {', '.join(fields[:-1])} and {fields[-1]}")
    return doc


def _body_number(doc: Mapping[str, Any], name: str, limits: tuple[float, float, float],
                 integer: bool) -> Any:
    default, lo, hi = limits
    if name not in doc:
        return default
    v = json_number(doc[name], lo, hi, integer)
    if v is None:
        kind = "an integer" if integer else "a finite number"
        raise HttpError(400, "bad_parameter", f"{name} must be {kind} between {lo:g} and {hi:g}, "
                        f"got {_shown(json.dumps(doc[name]))}")
    return v


# ---- /v1/timeline pages ---------------------------------------------------------------------

def _encode_slice(items: list[Any], limit: int, budget: int) -> list[bytes]:
    """Items encoded one by one, up to ``limit`` items and ``budget`` bytes (at least one item, so
    a page always moves forward). The interpreter is handed over between slices of items: one
    large ``json.dumps`` would hold it for the whole document and stall the model's thread."""
    out: list[bytes] = []
    used = 0
    for i, item in enumerate(items[:limit]):
        if i and i % _ITEMS_PER_SLICE == 0:
            time.sleep(0)
        b = dumps(item.to_dict())
        if out and used + len(b) > budget:
            break
        out.append(b)
        used += len(b) + 1
    return out


def timeline_page(samples: list[Any], ops: list[Any], after: tuple[float, int], limit: int,
                  max_bytes: int) -> bytes:
    """One page of ``GET /v1/timeline``: samples and operations after the cursor ``after``, in order,
    at most ``limit`` of each and about ``max_bytes`` of both; ``next`` is where the following page
    starts (null when nothing is left), ``resume`` where to poll from later for newer entries."""
    enc_samples = _encode_slice(samples, limit, max_bytes // 2)
    used = sum(len(b) for b in enc_samples)
    enc_ops = _encode_slice(ops, limit, max(max_bytes - used, 1))
    last_t = samples[len(enc_samples) - 1].t if enc_samples else after[0]
    last_id = ops[len(enc_ops) - 1].id if enc_ops else after[1]
    resume = make_cursor(last_t, last_id)
    more = len(enc_samples) < len(samples) or len(enc_ops) < len(ops)
    return b"".join((b'{"samples":[', b",".join(enc_samples), b'],"operations":[', b",".join(enc_ops),
                     b'],"next":', dumps(resume if more else None), b',"resume":', dumps(resume), b"}"))


Handler = Callable[[Request, Mapping[str, list[str]], str], Response]


class Endpoint:
    """All routes. ``bind_host``: the address served on (None when mounted in another server: then
    mutating routes without a token are allowed only to loopback clients)."""

    def __init__(self, rt: EndpointServices, token: str | None = None, bind_host: str | None = None,
                 max_body_bytes: int | None = None, base_url: str = "",
                 allowed_hosts: tuple[str, ...] | None = None,
                 allowed_origins: tuple[str, ...] | None = None) -> None:
        self.rt = rt
        cfg = self.rt.config
        http = cfg.http if cfg is not None else HttpConfig()
        self.token = token if token is not None else http.token
        self.bind_host = bind_host
        self.max_body_bytes = max_body_bytes if max_body_bytes is not None else http.max_body_bytes
        self.allowed_hosts = tuple(allowed_hosts if allowed_hosts is not None else http.allowed_hosts)
        self.allowed_origins = tuple(o.lower() for o in (allowed_origins if allowed_origins is not None
                                                          else http.allowed_origins))
        self.base_url = base_url
        self.registry = make_registry(self.rt.scrape, layers=False)  # layer families: the fast writer
        # each row's handler, looked up once: a row naming no method of this class fails here, not on a request
        self._handlers: dict[tuple[str, str], Handler] = {(r.method, r.path): getattr(self, r.handler)
                                                          for r in ROUTES}

    # ---- dispatch --------------------------------------------------------------------------
    def handle(self, req: Request) -> Response:
        try:
            resp = self._dispatch(req)
        except HttpError as e:
            resp = error_response(e.status, e.error, e.detail, e.headers)
        except ModelRequired as e:  # a missing parameter: the caller's input, not an unknown name
            resp = error_response(400, "bad_parameter", str(e))
        except UnknownModel as e:
            resp = error_response(404, "unknown_model", str(e))
        except Exception as e:  # our bug, not the caller's input: a 500 without a traceback
            rate_limited.warning("http-500", "memprof_otel: %s %s failed: %r", req.method, req.path[:200], e)
            resp = error_response(500, "internal", f"{type(e).__name__} while serving {req.path[:200]}")
        # which process answered: in a multi-worker server any worker may take the connection, and
        # a /v1/* document is that worker's (a header, so no document changes shape)
        resp.headers.setdefault(PID_HEADER, str(os.getpid()))
        origin = req.headers.get("origin")
        if origin is not None and origin.lower() in self.allowed_origins:  # CORS: only listed origins read
            resp.headers.setdefault("Access-Control-Allow-Origin", origin)
            resp.headers.setdefault("Vary", "Origin")
        return resp

    def _dispatch(self, req: Request) -> Response:
        path = req.path.rstrip("/") or "/"
        method = req.method.upper()
        if method == "HEAD":
            method = "GET"
        rows, arg = routes_at(path)
        route = next((r for r in rows if r.method == method), None)
        if route is None:
            allowed = sorted(r.method for r in rows)
            if allowed and method == "OPTIONS" and "origin" in req.headers:
                return self._preflight(req, allowed)
            if allowed:
                raise HttpError(405, "method_not_allowed", f"{method[:20]} is not allowed on {_shown(path)}",
                                {"Allow": ", ".join(allowed)})
            raise HttpError(404, "not_found", f"no route {_shown(path)}; see /openapi.json")
        self._check_host(req)
        if route.mutating:
            self._guard_browser(req)
        if not route.public:
            self._authorize(req, mutating=route.mutating)
        if len(req.body) > self.max_body_bytes:
            raise HttpError(413, "body_too_large", f"request body over {self.max_body_bytes} bytes")
        try:
            q = parse_qs(req.query, keep_blank_values=True, strict_parsing=False, max_num_fields=50)
        except ValueError as e:
            raise HttpError(400, "bad_query", str(e)) from None
        known = route.query
        if known is not None:
            unknown = sorted(set(q) - known)
            if unknown:
                takes = f"takes {', '.join(sorted(known))}" if known else "takes no query parameters"
                raise HttpError(400, "bad_parameter", f"unknown query parameter {_shown(unknown[0])}; "
                                f"{method} {route.path} {takes}")
        return self._handlers[route.method, route.path](req, q, arg)

    def _check_host(self, req: Request) -> None:
        host = req.headers.get("host")
        if not host_allowed(host, self.bind_host, self.allowed_hosts):
            raise HttpError(403, "host_not_allowed", f"Host {_shown(host or '')} is not this endpoint's: use "
                            "a loopback name or the bind address, or list the name in http.allowed_hosts")

    def _guard_browser(self, req: Request) -> None:
        """PUT/POST: no foreign Origin, and a JSON content type (a browser must then preflight,
        which only listed origins pass)."""
        origin = req.headers.get("origin")
        if origin is not None and origin.lower() not in self.allowed_origins:
            raise HttpError(403, "origin_not_allowed", f"requests from origin {_shown(origin)} are refused; "
                            "list it in http.allowed_origins to allow it")
        if media_type(req.headers.get("content-type", "")) != JSON:
            raise HttpError(415, "unsupported_media_type", "PUT and POST need Content-Type: application/json",
                            {"Accept": JSON})

    def _preflight(self, req: Request, allowed: list[str]) -> Response:
        """The answer to a browser's CORS preflight: 204 for a listed origin, 403 otherwise."""
        self._check_host(req)
        origin = req.headers["origin"]
        if origin.lower() not in self.allowed_origins:
            raise HttpError(403, "origin_not_allowed", f"requests from origin {_shown(origin)} are refused; "
                            "list it in http.allowed_origins to allow it")
        return Response(204, b"", JSON, {
            "Access-Control-Allow-Methods": ", ".join(allowed),
            "Access-Control-Allow-Headers": "Authorization, Content-Type", "Access-Control-Max-Age": "600"})

    def _authorize(self, req: Request, mutating: bool) -> None:
        if self.token:
            auth = req.headers.get("authorization", "")
            scheme, _, given = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.token.encode()):
                raise HttpError(401, "unauthorized", "missing or wrong bearer token",
                                {"WWW-Authenticate": 'Bearer realm="memprof-otel"'})
            return
        if mutating:
            local = is_loopback(self.bind_host) if self.bind_host is not None else is_loopback(req.client)
            if not local:
                raise HttpError(403, "forbidden", "mutating routes need http.token when the endpoint is "
                                "reachable from other hosts")

    # ---- routes ----------------------------------------------------------------------------
    def metrics(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        cfg = self.rt.config
        if cfg is not None and not cfg.prometheus.enabled:
            # an OTLP-only deployment serves no unauthenticated route that shows its figures
            raise HttpError(404, "prometheus_disabled", "the Prometheus exposition is off "
                            "(prometheus.enabled: false); figures go out over OTLP only")
        accept = req.headers.get("accept", "")
        folder = cfg.workers.snapshot_dir if cfg is not None else None
        if folder is None:
            body, content_type = render_exposition(self.rt.scrape, self.registry, accept)
        else:  # single-port mode: this worker's series, live, with every other live worker's file
            own, _ = render_exposition(self.rt.scrape, self.registry, OPENMETRICS)
            body, content_type = render_all_workers(
                own, folder, stale_after_s(cfg.workers.snapshot_interval, cfg.sampler.interval), accept,
                on_error=self.rt.counters.count_export_error)
        self.rt.scrape.record_series_exported(count_samples(body))  # what this answer hands the scraper
        # Prometheus asks for gzip; a 1,000-layer scrape shrinks ~13x (docs/benchmarks.md)
        if accepts_gzip(req.headers.get("accept-encoding", "")):
            return Response(200, gzip.compress(body, compresslevel=GZIP_LEVEL), content_type,
                            {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"})
        return Response(200, body, content_type, {"Vary": "Accept-Encoding"})

    def healthz(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        s = self.rt.sampler
        if s is None or not s.running:
            reason = "the sampler is not running"
            return json_response(503, {"status": "down", "reason": reason, "error": "sampler_down", "detail": reason})
        age = time.time() - s.last_success_unix if s.last_success_unix else None
        if age is not None and age > 5 * s.interval_s + 5:
            reason = f"no successful sample for {age:.0f} s"
            return json_response(503, {"status": "stale", "reason": reason, "error": "sampler_stale", "detail": reason})
        return json_response(200, {"status": "ok"})

    def status(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        models = []
        for _, h in sorted(live_handles().items()):
            models.append(h.status())
        sampler = self.rt.sampler
        health = sampler.health() if sampler is not None else {"running": False, "sources": {}}
        sources = dict(health.get("sources", {}))
        for name, reason in registry.down_reasons().items():
            sources[name] = {"up": False, "errors": 0, "last_error": reason}
        bb = self.rt.blackbox.source_status()  # the same view as memprof_source_up{source="blackbox"}
        if bb is not None:
            sources["blackbox"] = bb
        cfg = self.rt.config
        return json_response(200, {
            "version": __version__, "pid": os.getpid(), "torch_version": self.rt.scrape.self_view().torch_version,
            "models": models, "sources": sources, "sampler": {k: v for k, v in health.items() if k != "sources"},
            "config": cfg.to_dict() if cfg is not None else None, "started_unix": self.rt.started_unix,
            "series": self.rt.scrape.budget.status()})

    def layers(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        name = _str_param(q, "model")
        handles = [self.rt.dump_service.pick_model(name)] if name else list(live_handles().values())
        return json_response(200, {"models": {h.name: {
            "device": h.last_device,
            "layers": {k: v.to_dict() for k, v in sorted(h.layer_stats().items())},
            "window": {k: f._asdict() for k, f in sorted(h.exported_layer_peaks().items())},
            # what `memprof-otel baseline save` records besides the figures (docs/reference.md)
            "structure": h.layer_signatures(), "environment": h.environment(),
        } for h in handles}})

    def timeline(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        since = _float_param(q, "since", None, 0.0, 10 * 365 * 86400.0)
        limit = _int_param(q, "limit", TIMELINE_DEFAULT_LIMIT, 1, TIMELINE_MAX_LIMIT)
        raw_cursor = _str_param(q, "cursor")
        after = parse_cursor(raw_cursor) if raw_cursor is not None else (0.0, 0)
        if after is None:
            raise HttpError(400, "bad_parameter", "cursor must be the `next` or `resume` value of an earlier "
                            f"page, got {_shown(raw_cursor or '')}")
        since_unix = None if since is None else time.time() - since
        samples = [x for x in self.rt.samples(since_unix) if x.t > after[0]]
        ops = [r for r in self.rt.tracker.records(since_unix) if r.id > after[1]]
        return Response(200, timeline_page(samples, ops, after, limit, TIMELINE_MAX_BYTES), JSON)

    def alerts(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        wd = self.rt.watchdog
        return json_response(200, {"alerts": wd.alerts() if wd is not None else []})

    def leaks(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        top = _int_param(q, "top", LEAKS_DEFAULT_TOP, 1, LEAKS_MAX_TOP)
        watch = self.rt.leaks
        if watch is None:  # monitoring not started: nothing watched yet, the same document shape
            watch = LeakWatch(LeaksConfig(enabled=False), dict)
        return json_response(200, watch.report(top))

    def headroom(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        """Every other query parameter than ``model`` is a shape feature (batch, seq_len, cache_len,
        or the names a model's ``shape_of`` returns)."""
        name = _str_param(q, "model")
        features = _shape_features(q)
        if features and name is None and len(live_handles()) > 1:
            raise HttpError(400, "bad_parameter", "model is required with shape features when several "
                            "models are instrumented")
        if name is not None or features:
            handles = [self.rt.dump_service.pick_model(name)]  # unknown: 404 unknown_model
        else:
            handles = sorted(live_handles().values(), key=lambda h: h.name)
        out: dict[str, Any] = {}
        for h in handles:
            if h.capacity is None:
                out[h.name] = {"enabled": False, "reason": "the memory model is off (capacity.enabled: false)"}
            else:
                try:
                    out[h.name] = h.headroom(**features)
                except ShapeError as e:  # a feature the model never saw, or one it needs: the caller's input
                    raise HttpError(400, "bad_shape", str(e)) from None
        doc: dict[str, Any] = {"models": out}
        if not handles:
            doc["reason"] = "no model is instrumented in this process"
        return json_response(200, doc)

    def advice(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        """Advice over what was measured, each citing its figures. Read-only: starts nothing, so
        before any data it answers an empty list with notes saying what is missing."""
        model = _str_param(q, "model")
        floor = q.get("min_severity", [SEVERITIES[0]])[-1]  # an empty value is refused, not the default
        if floor not in SEVERITIES:
            raise HttpError(400, "bad_parameter", f"min_severity must be one of {', '.join(SEVERITIES)}, "
                            f"got {_shown(floor)}")
        return json_response(200, self.rt.advisor.report(model, floor))  # UnknownModel: 404 unknown_model

    def memory(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        """Where the memory goes, per device, as of the last sampler tick. Read-only: starts nothing."""
        return json_response(200, self.rt.memory.document())

    def postmortem(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        """The processes of this service that ended without a clean shutdown, from their black boxes."""
        return json_response(200, self.rt.blackbox.document())

    def get_rules(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        wd = self.rt.watchdog
        return json_response(200, {"rules": [r.to_dict() for r in (wd.rules if wd is not None else ())]})

    def put_rules(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        doc = _json_body(req)
        raw = doc.get("rules") if isinstance(doc, dict) else doc
        if not isinstance(raw, list):
            raise HttpError(400, "bad_rules", 'expected {"rules": [...]} or a JSON list of rules')
        if len(raw) > MAX_RULES:
            raise HttpError(400, "bad_rules", f"rules: at most {MAX_RULES} rules, got {len(raw)}")
        try:
            rules = [parse_rule(r, f"rules[{i}]") for i, r in enumerate(raw)]
        except ConfigError as e:
            raise HttpError(400, "bad_rule", str(e)) from None
        names = [r.name for r in rules]
        if len(set(names)) != len(names):
            raise HttpError(400, "bad_rules", "rule names must be unique")
        wd = self.rt.watchdog
        if wd is None:
            self.rt.ensure_started()
            wd = self.rt.watchdog
        wd.set_rules(rules)
        return json_response(200, {"rules": [r.to_dict() for r in wd.rules]})

    def post_dump(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        """202 with the pending job at once (``Location``: its status); with ``wait``, blocks up to
        that long and answers 200 with the stored dump, or the failure's 4xx/5xx, if done by then."""
        kind = q.get("kind", ["speedscope"])[-1]
        if kind != "speedscope":
            raise HttpError(400, "bad_parameter", f"kind must be speedscope, got {_shown(kind)}")
        forwards = _int_param(q, "forwards", 1, 1, 1000)
        timeout = _float_param(q, "timeout", 30.0, 0.01, 600.0)
        wait = _float_param(q, "wait", 0.0, 0.0, DUMP_WAIT_MAX)
        model = _str_param(q, "model")
        try:
            job = self.rt.dump_service.submit(model, forwards, float(timeout or 30.0), reason="http")
        except ModelRequired as e:
            raise HttpError(400, "bad_parameter", str(e)) from None
        except UnknownModel as e:
            raise HttpError(404, "unknown_model", str(e)) from None
        except CaptureBusy as e:
            raise HttpError(409, "capture_in_progress", str(e)) from None
        except CaptureUnsupported as e:
            raise HttpError(409, "capture_unsupported", str(e)) from None
        except InstrumentationError as e:
            raise HttpError(409, "uninstrumented", str(e)) from None
        return self._job_response(job, wait or 0.0, failure_is_error=True)

    def _job_response(self, job: DumpJob, wait: float, failure_is_error: bool) -> Response:
        """202 while pending, 200 once finished. A POST that waited for a failure answers the
        failure's status (504 no forward in time, 507 not stored, ...) instead: the body is the
        job, which has ``error`` and ``detail`` like every error body."""
        if wait > 0 and not job.done:
            job.wait(wait)
        body = job.to_dict(self.base_url)  # one read: the worker may finish meanwhile
        headers = {"Location": f"{self.base_url}/v1/dumps/{job.id}"}
        if body["status"] == PENDING:
            headers["Retry-After"] = "1"
            return json_response(202, body, headers)
        if failure_is_error and body["status"] == FAILED:
            return json_response(_FAILED_STATUS.get(str(body["error"]), 500), body, headers)
        return json_response(200, body, headers)

    def post_heap(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        """Trace the Python heap for ``seconds`` and answer its top growing allocation sites."""
        doc = _body_fields(req, q, "POST /v1/heap", ("seconds", "frames", "top"), '{"seconds": 10}')
        seconds = _body_number(doc, "seconds", HEAP_SECONDS, integer=False)
        frames = _body_number(doc, "frames", HEAP_FRAMES, integer=True)
        top = _body_number(doc, "top", HEAP_TOP, integer=True)
        try:
            result = self.rt.heap.run(float(seconds), int(frames), int(top))
        except CaptureBusy as e:
            raise HttpError(409, "heap_diff_in_progress", str(e)) from None
        return json_response(200, result.to_dict(self.base_url))

    def post_baseline(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        """Open a measuring window on a model, wait until it kept ``forwards`` forwards or ``timeout``
        seconds passed, and answer the baseline of what it kept, per shape (``attribution/
        measure_window.py``), with what the window cost (``window``)."""
        doc = _body_fields(req, q, "POST /v1/baseline", ("model", "forwards", "timeout"),
                           '{"forwards": 100, "timeout": 60}')
        name = doc.get("model")
        if "model" in doc and not isinstance(name, str):  # null included: leave the field out instead
            raise HttpError(400, "bad_parameter", f"model must be a string, got {_shown(json.dumps(name))}")
        forwards = int(_body_number(doc, "forwards", BASELINE_FORWARDS, integer=True))
        timeout = float(_body_number(doc, "timeout", BASELINE_TIMEOUT, integer=False))
        h = self.rt.dump_service.pick_model(name)  # none named and several: 400; unknown: 404
        before = h.overhead_seconds
        try:
            win = h.measure_window(forwards)
        except CaptureBusy as e:
            raise HttpError(409, "baseline_in_progress", str(e)) from None
        except InstrumentationError as e:
            raise HttpError(409, "uninstrumented", str(e)) from None
        try:
            win.wait(timeout)
        finally:
            h.end_window(win)
        shapes = win.close()
        cost = {"forwards_requested": forwards, "forwards_kept": win.kept, "forwards_raised": win.raised,
                "forwards_dropped": win.dropped, "complete": win.complete, "seconds": round(win.seconds, 3),
                "timeout_seconds": timeout,
                "overhead_seconds": round(max(0.0, h.overhead_seconds - before), 6)}
        if not shapes:
            dropped = (f" ({win.dropped} ran but overlapped another forward on the device: their figures "
                       "were dropped; send the baseline's traffic one request at a time)" if win.dropped else "")
            raise HttpError(504, "no_forward_in_time", f"no forward of {h.name!r} was kept within {timeout:g} s"
                            f"{dropped}: send traffic while the baseline is taken")
        env: dict[str, str | None] = {"device": h.last_device}
        env.update(h.environment())
        body = from_shapes(h.name, shapes, h.layer_signatures(), environment=env).to_dict()
        return json_response(200, {**body, "window": cost})

    def list_dumps(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        try:
            dumps = self.rt.dump_service.store.list()
        except ExportError as e:
            raise HttpError(503, "dump_folder_unusable", str(e)) from None
        return json_response(200, {"dumps": [d.to_dict(self.base_url) for d in dumps]})

    def get_dump(self, req: Request, q: Mapping[str, list[str]], dump_id: str) -> Response:
        """A job id (``job-...``): the request's status (202 pending, 200 complete or failed;
        ``wait`` long-polls). A dump id: the stored file itself."""
        wait = _float_param(q, "wait", 0.0, 0.0, DUMP_WAIT_MAX)
        fmt = q.get("format", [DUMP_FORMATS[0]])[-1]
        if fmt not in DUMP_FORMATS:
            raise HttpError(400, "bad_parameter", f"format must be one of {', '.join(DUMP_FORMATS)}, "
                                                  f"got {_shown(fmt)}")
        if JOB_ID_RE.fullmatch(dump_id):
            if "format" in q:  # a request's status is JSON; its dump's url is where a format applies
                raise HttpError(400, "bad_parameter", f"format applies to dump ids, not to the request {dump_id}: "
                                "download the dump at the `dump.url` of the complete request")
            job = self.rt.dump_service.jobs.get(dump_id)
            if job is None:
                raise HttpError(404, "job_not_found", f"no dump request {dump_id} (the last "
                                f"{self.rt.dump_service.jobs.max_finished} finished ones are kept)")
            return self._job_response(job, wait or 0.0, failure_is_error=False)
        if not is_dump_id(dump_id):  # checked here too, to echo the id cut short
            raise HttpError(400, "bad_dump_id", f"not a dump id nor a request id: {_shown(dump_id)}")
        try:
            body = self.rt.dump_service.store.read(dump_id)
        except InvalidDumpId as e:
            raise HttpError(400, "bad_dump_id", str(e)) from None
        except DumpNotFound as e:
            raise HttpError(404, "dump_not_found", str(e)) from None
        except ExportError as e:  # the folder is no longer private, or the file cannot be read
            raise HttpError(503, "dump_folder_unusable", str(e)) from None
        if fmt == "pprof":
            try:
                flame = flame_from_stored(body)  # every check of the stored bytes is made there
            except MalformedDump as e:  # broken, or written so by another process sharing the folder
                raise HttpError(422, "malformed_dump", f"the stored dump {dump_id} is malformed, so it has "
                                f"no pprof form: {str(e)[:200]}") from None
            except ValueError as e:  # an OOM record, a CUDA snapshot: no flame graph
                raise HttpError(400, "bad_parameter", f"dump {dump_id} is not a flame graph, so it has no "
                                                      f"pprof form ({e}); format=speedscope downloads it") from None
            pprof = build_pprof(flame)
            return Response(200, pprof, "application/octet-stream",
                            {"Content-Disposition": f'attachment; filename="{dump_id}.pb.gz"'})
        return Response(200, body, JSON, {"Content-Disposition": f'attachment; filename="{dump_id}.json"'})

    def openapi(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        return json_response(200, openapi_document())
