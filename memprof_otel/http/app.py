"""The HTTP endpoint's routes as one transport-free function: ``Endpoint.handle(Request) -> Response``.

The server (``http_server.serve``) and the WSGI/ASGI adapters only translate to and from these two
types. Every error is JSON ``{"error", "detail"}`` with a 4xx code for bad input; an unexpected
failure is a 500 with the exception's type, never a traceback.
"""
from __future__ import annotations

import hmac
import ipaddress
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol
from urllib.parse import parse_qs


from .._log import rate_limited
from .._version import __version__
from ..config import Config, ConfigError, parse_rule
from ..errors import (CaptureBusy, CaptureTimeout, DumpNotFound, ExportError, InstrumentationError, InvalidDumpId,
                     UnknownModel)
from ..attribution.torch.instrumentation import live_instrumentations
from ..dumps.service import DumpService
from ..export.prometheus import ScrapeSource, make_registry, render_exposition
from ..sources import registry
from ..telemetry.operations import OperationTracker
from ..telemetry.sampler import Sampler
from ..telemetry.series import SelfView
from ..watchdog.adapter import Watchdog
from .openapi import openapi_document

PUBLIC_ROUTES = ("/metrics", "/healthz")


class EndpointServices(ScrapeSource, Protocol):
    """What the routes read and drive (the process runtime is one; the composition root passes it)."""

    config: Config | None
    sampler: Sampler | None
    tracker: OperationTracker
    watchdog: Watchdog | None
    dump_service: DumpService
    started_unix: float
    servers: list[Any]

    def ensure_started(self, config: Config | None = None) -> Any: ...
    def self_view(self) -> SelfView: ...
JSON = "application/json"


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
    body = json.dumps(obj, default=_json_default, allow_nan=False, separators=(",", ":")).encode()
    return Response(status, body, JSON, headers or {})


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def error_response(status: int, error: str, detail: str, headers: dict[str, str] | None = None) -> Response:
    return json_response(status, {"error": error, "detail": detail}, headers)


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _float_param(q: Mapping[str, list[str]], name: str, default: float | None, lo: float, hi: float) -> float | None:
    raw = q.get(name)
    if raw is None:
        return default
    try:
        v = float(raw[-1])
    except ValueError:
        raise HttpError(400, "bad_parameter", f"{name} must be a number, got {raw[-1]!r}") from None
    if not (lo <= v <= hi) or not math.isfinite(v):
        raise HttpError(400, "bad_parameter", f"{name} must be between {lo:g} and {hi:g}, got {raw[-1]!r}")
    return v


def _int_param(q: Mapping[str, list[str]], name: str, default: int, lo: int, hi: int) -> int:
    raw = q.get(name)
    if raw is None:
        return default
    try:
        v = int(raw[-1])
    except ValueError:
        raise HttpError(400, "bad_parameter", f"{name} must be an integer, got {raw[-1]!r}") from None
    if not lo <= v <= hi:
        raise HttpError(400, "bad_parameter", f"{name} must be between {lo} and {hi}, got {v}")
    return v


Handler = Callable[[Request, Mapping[str, list[str]], str], Response]


class Endpoint:
    """All routes. ``bind_host``: the address served on (None when mounted in another server: then
    mutating routes without a token are allowed only to loopback clients)."""

    def __init__(self, rt: EndpointServices, token: str | None = None, bind_host: str | None = None,
                 max_body_bytes: int | None = None, base_url: str = "") -> None:
        self.rt = rt
        cfg = self.rt.config
        self.token = token if token is not None else (cfg.http.token if cfg is not None else None)
        self.bind_host = bind_host
        self.max_body_bytes = max_body_bytes if max_body_bytes is not None else (
            cfg.http.max_body_bytes if cfg is not None else 1 << 20)
        self.base_url = base_url
        self.registry = make_registry(self.rt, layers=False)  # layer families: the fast writer
        self._routes: dict[tuple[str, str], Handler] = {
            ("GET", "/metrics"): self.metrics, ("GET", "/healthz"): self.healthz,
            ("GET", "/v1/status"): self.status, ("GET", "/v1/layers"): self.layers,
            ("GET", "/v1/timeline"): self.timeline, ("GET", "/v1/alerts"): self.alerts,
            ("GET", "/v1/watchdog/rules"): self.get_rules, ("PUT", "/v1/watchdog/rules"): self.put_rules,
            ("POST", "/v1/dumps"): self.post_dump, ("GET", "/v1/dumps"): self.list_dumps,
            ("GET", "/openapi.json"): self.openapi,
        }

    # ---- dispatch --------------------------------------------------------------------------
    def handle(self, req: Request) -> Response:
        try:
            return self._dispatch(req)
        except HttpError as e:
            return error_response(e.status, e.error, e.detail, e.headers)
        except UnknownModel as e:
            return error_response(404, "unknown_model", str(e))
        except Exception as e:  # our bug, not the caller's input: a 500 without a traceback
            rate_limited.warning("http-500", "memprof_otel: %s %s failed: %r", req.method, req.path, e)
            return error_response(500, "internal", f"{type(e).__name__} while serving {req.path}")

    def _dispatch(self, req: Request) -> Response:
        path = req.path.rstrip("/") or "/"
        method = req.method.upper()
        if method == "HEAD":
            method = "GET"
        arg = ""
        key = (method, path)
        if path.startswith("/v1/dumps/"):  # any rest, even "../x" decoded from %2F: the id check rejects it
            key, arg = (method, "/v1/dumps/{id}"), path[len("/v1/dumps/"):]
            if method != "GET":
                raise HttpError(405, "method_not_allowed", f"{method} is not allowed on {path}", {"Allow": "GET"})
        handler = self._routes.get(key) if key[1] != "/v1/dumps/{id}" else self.get_dump
        if handler is None:
            allowed = sorted(m for (m, p) in self._routes if p == path)
            if allowed:
                raise HttpError(405, "method_not_allowed", f"{method} is not allowed on {path}",
                                {"Allow": ", ".join(allowed)})
            raise HttpError(404, "not_found", f"no route {path}; see /openapi.json")
        if path not in PUBLIC_ROUTES:
            self._authorize(req, mutating=method in ("PUT", "POST"))
        if len(req.body) > self.max_body_bytes:
            raise HttpError(413, "body_too_large", f"request body over {self.max_body_bytes} bytes")
        try:
            q = parse_qs(req.query, keep_blank_values=True, strict_parsing=False, max_num_fields=50)
        except ValueError as e:
            raise HttpError(400, "bad_query", str(e)) from None
        return handler(req, q, arg)

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
        body, content_type = render_exposition(self.rt, self.registry, req.headers.get("accept", ""))
        return Response(200, body, content_type)

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
        for name, h in sorted(live_instrumentations().items()):
            st = h.scheduler.state()
            models.append({"name": name, "device": h.last_device, "layers": h.layer_count, "paused": h.paused,
                           "forwards": st.forwards, "attributed_forwards": st.attributed,
                           "overhead_seconds": st.attribution_seconds, "hook_errors": h.hook_errors,
                           "forward_errors": h.forward_errors})
        sampler = self.rt.sampler
        health = sampler.health() if sampler is not None else {"running": False, "sources": {}}
        sources = dict(health.get("sources", {}))
        for name, reason in registry.down_reasons().items():
            sources[name] = {"up": False, "errors": 0, "last_error": reason}
        cfg = self.rt.config
        return json_response(200, {
            "version": __version__, "torch_version": self.rt.self_view().torch_version,
            "models": models, "sources": sources, "sampler": {k: v for k, v in health.items() if k != "sources"},
            "config": cfg.to_dict() if cfg is not None else None, "started_unix": self.rt.started_unix})

    def layers(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        name = q.get("model", [None])[-1]
        handles = [self.rt.dump_service.pick_model(name)] if name else list(live_instrumentations().values())
        return json_response(200, {"models": {h.name: {
            "device": h.last_device,
            "layers": {k: v.to_dict() for k, v in sorted(h.layer_stats().items())},
            "window": {k: f._asdict() for k, f in sorted(h.exported_layer_peaks().items())},
        } for h in handles}})

    def timeline(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        since = _float_param(q, "since", None, 0.0, 10 * 365 * 86400.0)
        since_unix = None if since is None else time.time() - since
        s = self.rt.sampler
        samples = s.samples(since_unix) if s is not None else []
        return json_response(200, {"samples": [x.to_dict() for x in samples],
                                   "operations": [r.to_dict() for r in self.rt.tracker.records(since_unix)]})

    def alerts(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        wd = self.rt.watchdog
        return json_response(200, {"alerts": wd.alerts() if wd is not None else []})

    def get_rules(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        wd = self.rt.watchdog
        return json_response(200, {"rules": [r.to_dict() for r in (wd.rules if wd is not None else ())]})

    def put_rules(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        try:
            doc = json.loads(req.body or b"null")
        except (ValueError, UnicodeDecodeError) as e:
            raise HttpError(400, "bad_json", f"body is not JSON: {e}") from None
        raw = doc.get("rules") if isinstance(doc, dict) else doc
        if not isinstance(raw, list):
            raise HttpError(400, "bad_rules", 'expected {"rules": [...]} or a JSON list of rules')
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
        kind = q.get("kind", ["speedscope"])[-1]
        if kind != "speedscope":
            raise HttpError(400, "bad_parameter", f"kind must be speedscope, got {kind!r}")
        forwards = _int_param(q, "forwards", 1, 1, 1000)
        timeout = _float_param(q, "timeout", 30.0, 0.01, 600.0)
        model = q.get("model", [None])[-1] or None
        try:
            info = self.rt.dump_service.capture(model, forwards, float(timeout or 30.0), reason="http")
        except UnknownModel as e:
            raise HttpError(404, "unknown_model", str(e)) from None
        except CaptureBusy as e:
            raise HttpError(409, "capture_in_progress", str(e)) from None
        except CaptureTimeout as e:
            raise HttpError(504, "no_forward_in_time", str(e)) from None
        except InstrumentationError as e:
            raise HttpError(409, "uninstrumented", str(e)) from None
        except ExportError as e:
            raise HttpError(507, "dump_not_stored", str(e)) from None
        d = info.to_dict(self.base_url)
        snapshot = self.rt.dump_service.related.get(info.id)
        if snapshot is not None:  # CUDA: the allocator history of the same window
            d["cuda_snapshot"] = snapshot.to_dict(self.base_url)
        return json_response(201, d, {"Location": f"/v1/dumps/{info.id}"})

    def list_dumps(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        return json_response(200, {"dumps": [d.to_dict(self.base_url) for d in self.rt.dump_service.store.list()]})

    def get_dump(self, req: Request, q: Mapping[str, list[str]], dump_id: str) -> Response:
        try:
            body = self.rt.dump_service.store.read(dump_id)
        except InvalidDumpId as e:
            raise HttpError(400, "bad_dump_id", str(e)) from None
        except DumpNotFound as e:
            raise HttpError(404, "dump_not_found", str(e)) from None
        return Response(200, body, JSON, {"Content-Disposition": f'attachment; filename="{dump_id}.json"'})

    def openapi(self, req: Request, q: Mapping[str, list[str]], _: str) -> Response:
        return json_response(200, openapi_document())
