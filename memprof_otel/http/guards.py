"""The endpoint's edge checks, pure functions of header and query strings: whose ``Host`` a request
names, what its content type is, whether a query number is a plain finite decimal, what a
``/v1/timeline`` cursor holds, and the limits the routes and the OpenAPI document share.

They know no route, response or runtime, so the handlers (``app.py``), the route table
(``routes.py``) and the body schemas (``schemas.py``) all import them.
"""
from __future__ import annotations

import ipaddress
import math
import re

JSON = "application/json"
LOOPBACK_NAMES = ("localhost",)
MAX_NUMBER_CHARS = 32      # a query number longer than this is junk, whatever it parses to
MAX_NAME_CHARS = 256       # model names and other free strings in a query
TIMELINE_DEFAULT_LIMIT = 500
TIMELINE_MAX_LIMIT = 5000
LEAKS_DEFAULT_TOP, LEAKS_MAX_TOP = 10, 1000  # surviving layers GET /v1/leaks lists
TIMELINE_MAX_BYTES = 2 << 20  # encoded items in one page of /v1/timeline, both lists together
# longest ?wait= a dump request may block for: under the 60 s idle timeout of common proxies and
# load balancers (nginx, AWS ALB), so a blocking call is answered (202 at worst) before they cut it
DUMP_WAIT_MAX = 55.0
DUMP_FORMATS = ("speedscope", "pprof")  # GET /v1/dumps/{id}?format=: the first is the default
# POST /v1/heap body: (default, least, most). At most DUMP_WAIT_MAX seconds of tracing, for the same
# reason: the answer comes back before a proxy's 60 s idle timeout cuts the request.
HEAP_SECONDS = (10.0, 1.0, DUMP_WAIT_MAX)
# a measuring window (POST /v1/baseline): every model forward attributed while it is open, so it is
# bounded by a forward count and a time limit (default, least, most)
BASELINE_FORWARDS = (100, 1, 10_000)
BASELINE_TIMEOUT = (60.0, 0.1, 600.0)
HEAP_FRAMES = (4, 1, 100)    # each frame costs on every allocation (docs/benchmarks.md): 4 by default
HEAP_TOP = (20, 1, 200)


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


_DECIMAL_RE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_INTEGER_RE = re.compile(r"[+-]?[0-9]{1,18}")


def parse_number(raw: str, lo: float, hi: float) -> float | None:
    """A finite decimal number in [lo, hi], or None. Only plain decimal notation: ``float()`` would
    also take "nan", "inf", "1_0" and surrounding blanks."""
    if len(raw) > MAX_NUMBER_CHARS or not _DECIMAL_RE.fullmatch(raw):
        return None
    v = float(raw)
    return v if math.isfinite(v) and lo <= v <= hi else None


def parse_integer(raw: str, lo: int, hi: int) -> int | None:
    if not _INTEGER_RE.fullmatch(raw):
        return None
    v = int(raw)
    return v if lo <= v <= hi else None


def json_number(value: object, lo: float, hi: float, integer: bool = False) -> float | int | None:
    """A number from a JSON body, finite and in [lo, hi] (an integer when ``integer``), or None.
    ``true``/``false`` are not numbers here, though Python's ``bool`` is an ``int``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if integer and not isinstance(value, int):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if lo <= value <= hi else None


# ---- other origins: Host (DNS rebinding), Origin and Content-Type (cross-site requests) --------

def host_name(header: str) -> str | None:
    """The name in a ``Host`` header, lower-cased, without port, brackets or a final dot;
    None when the header is malformed."""
    h = header.strip().lower()
    if h.startswith("["):
        end = h.find("]")
        name, rest = (h[1:end], h[end + 1:]) if end > 0 else ("", "x")
    else:
        name, sep, port = h.partition(":")
        rest = sep + port
    if rest and not (rest[0] == ":" and rest[1:].isdigit() and len(rest) <= 6):
        return None
    name = name.rstrip(".")
    return name if name and len(name) <= 253 else None


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return None


def host_allowed(header: str | None, bind_host: str | None, allowed: tuple[str, ...]) -> bool:
    """Whether a request's ``Host`` names this endpoint: a loopback name or address, the bind
    address, a configured name (``*``: any). On a wildcard bind (0.0.0.0, ::) or when mounted in
    another server (``bind_host`` None), any IP literal is the endpoint's own address; DNS rebinding
    needs a name, and names must be listed. No header at all (an HTTP/1.0 tool) is not a browser."""
    if header is None or "*" in allowed:
        return True
    name = host_name(header)
    if name is None:
        return False
    if name in LOOPBACK_NAMES or name in allowed:
        return True
    ip = _ip(name)
    bound = (bind_host or "").strip("[]").lower()
    if ip is None:
        return name == bound
    bound_ip = _ip(bound) if bound else None
    if ip.is_loopback or bind_host is None or (bound_ip is not None and (bound_ip.is_unspecified or ip == bound_ip)):
        return True
    return ip in {_ip(a) for a in allowed}


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` header (RFC 9110) takes gzip: ``gzip`` or ``*`` listed with a
    q-value above 0 (``gzip;q=0`` refuses it; prometheus_client's own check ignores q)."""
    best: dict[str, float] = {}
    for item in accept_encoding.split(","):
        coding, *params = [p.strip() for p in item.split(";")]
        q = 1.0
        for p in params:
            name, _, value = p.partition("=")
            if name.strip().lower() == "q":
                q = parse_number(value.strip(), 0.0, 1.0) or 0.0
        if coding:
            best[coding.lower()] = q
    return best.get("gzip", best.get("x-gzip", best.get("*", 0.0))) > 0


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


# ---- /v1/timeline pages ---------------------------------------------------------------------

def make_cursor(t: float, op_id: int) -> str:
    """A page position: the last sample time and the last operation id already sent."""
    return f"{t!r}_{op_id}"


def parse_cursor(raw: str) -> tuple[float, int] | None:
    t, sep, op_id = raw.partition("_")
    if not sep:
        return None
    when = parse_number(t, 0.0, 1e12)
    ident = parse_integer(op_id, 0, 2**62)
    return None if when is None or ident is None else (when, ident)
