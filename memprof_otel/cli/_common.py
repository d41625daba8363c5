"""What the subcommands share: the typed command error and a small urllib client for the endpoint.

Only the standard library: ``memprof-otel dump`` and ``monitor`` must work wherever the package is
installed, with no extra dependency.
"""
from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Mapping

from ..errors import MemprofError

EXIT_FAILURE = 1   # the command could not do its job (endpoint down, HTTP error, file not written)
EXIT_USAGE = 2     # the input is wrong (bad config, bad JSON, bad URL); like argparse's own errors
EXIT_ADVICE = 3    # the command worked and found what --fail-on asked about (advise): distinct from 1


class CommandError(MemprofError):
    """A subcommand failed: ``main`` prints ``memprof-otel: error: <message>`` and exits ``exit_code``."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


TOKEN_ENV = "MEMPROF_OTEL_HTTP_TOKEN"  # the endpoint's own setting: one variable for both sides


def check_bounds(name: str, value: float, limits: tuple[float, float, float]) -> None:
    """``--name``'s value within the endpoint's own ``(default, least, most)`` (``http/guards.py``),
    checked before asking; else exit 2 with one line."""
    if not limits[1] <= value <= limits[2]:  # NaN fails this too
        raise CommandError(f"--{name} must be between {limits[1]:g} and {limits[2]:g}, got {value:g}", EXIT_USAGE)


def add_endpoint_arguments(p: Any) -> None:
    """``--url`` and ``--token``, the same on every subcommand that talks to a running endpoint."""
    p.add_argument("--url", required=True, help="the memprof-otel endpoint, e.g. http://127.0.0.1:9464")
    # the variable is read when the request is made, not as the default: --help never prints a secret
    p.add_argument("--token", default=None, help=f"bearer token, when the endpoint has one (default: ${TOKEN_ENV})")


def redact_url(url: str) -> str:
    """``url`` with a ``user:password@`` part shown as ``***@``: what error messages and the monitor
    header echo, so a password given in --url never reaches a terminal, a log or a CI transcript.
    Plain string work, so it also redacts a URL that urllib cannot parse."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    netloc_end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    netloc = rest[:netloc_end]
    if "@" not in netloc:
        return url
    return f"{scheme}://***@{netloc.rpartition('@')[2]}{rest[netloc_end:]}"


def _url_problem(parts: urllib.parse.SplitResult) -> str | None:
    """What is wrong with a split --url (None: nothing). Checked before any request, so that a typo
    is bad input (exit 2) rather than a failure to reach it (exit 1) or a surprise from urllib."""
    if parts.scheme not in ("http", "https"):
        return f"the scheme must be http or https, not {parts.scheme!r}"
    if not parts.hostname:
        return "no host"
    if any(c.isspace() or not c.isprintable() for c in parts.geturl()):  # urllib refuses them later
        return "a space or control character in it"
    try:
        port = parts.port  # urllib raises for a port that is not a number or over 65535
    except ValueError:
        return f"the port must be a number in 1..65535, got {parts.netloc.rpartition(':')[2]!r}"
    if port == 0:
        return "the port must be a number in 1..65535, got '0'"
    if parts.query or parts.fragment:  # the command appends its own paths and queries to --url
        return "it has a query or fragment (give the endpoint's base URL only)"
    return None


def endpoint_url(url: str) -> str:
    """``url`` without a trailing slash; a CommandError (exit 2) naming --url and what is wrong
    unless it is http(s)://host[:port][/mount path]."""
    text = url.strip()
    try:  # without "://", urllib reads host:port as a scheme and a path
        problem = _url_problem(urllib.parse.urlsplit(text)) if "://" in text else "no http:// or https://"
    except ValueError as e:  # an unclosed [IPv6 address, for one
        problem = str(e)[:1].lower() + str(e)[1:]
    if problem:
        raise CommandError(f"--url {redact_url(text)!r} is not an endpoint URL: {problem} "
                           "(e.g. http://127.0.0.1:9464)", EXIT_USAGE)
    return text.rstrip("/")


def _split_credentials(base: str) -> tuple[str, str | None]:
    """(``base`` without ``user:password@``, a Basic Authorization header for them or None). urllib
    would take them for part of the host name; sent as a header they reach a proxy that asks."""
    parts = urllib.parse.urlsplit(base)
    if "@" not in parts.netloc:
        return base, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    creds = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}".encode()
    return parts._replace(netloc=hostport).geturl(), "Basic " + base64.b64encode(creds).decode("ascii")


# the HTTP statuses that mean the command's input was wrong (exit 2, like argparse's own errors):
# a bad or missing parameter, an unknown model, a token missing or wrong, a route that is not there
_BAD_INPUT = {400, 401, 403, 404, 405, 413, 415}
NOT_OURS = "no memprof-otel JSON error in the answer: is --url a memprof-otel endpoint?"


def _server_error(body: bytes) -> str:
    """The endpoint's ``{"error", "detail"}`` (or FastAPI's ``{"detail"}``) as one short phrase,
    in the CLI's words: the query parameter ``model=NAME`` is the option ``--model NAME`` here."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        text = body.decode("utf-8", "replace").strip()
        return text[:200] + ("; " if text else "") + NOT_OURS
    if isinstance(doc, dict):
        parts = [str(doc[k]) for k in ("error", "detail") if doc.get(k)]
        if parts:
            return ": ".join(parts).replace("model=NAME", "--model NAME")
    return json.dumps(doc)[:200] + "; " + NOT_OURS


class Client:
    """GET/POST against a memprof-otel endpoint; every failure becomes a one-line CommandError."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 10.0) -> None:
        given = endpoint_url(url)
        # base and url() are what messages and the monitor header show: credentials redacted; the
        # requests go to _base, with the credentials (if any) as a header
        self.base = redact_url(given)
        self._base, self._basic_auth = _split_credentials(given)
        self.token = token if token is not None else (os.environ.get(TOKEN_ENV) or None)
        self.timeout = timeout

    def url(self, path: str, query: Mapping[str, Any] | None = None) -> str:
        """The URL of ``path`` as messages show it (a ``user:password@`` in --url redacted)."""
        return self._full(self.base, path, query)

    @staticmethod
    def _full(base: str, path: str, query: Mapping[str, Any] | None) -> str:
        full = path if path.startswith(("http://", "https://")) else base + "/" + path.lstrip("/")
        q = {k: v for k, v in (query or {}).items() if v is not None}
        return full + ("?" + urllib.parse.urlencode(q) if q else "")

    def request(self, method: str, path: str, query: Mapping[str, Any] | None = None,
                timeout: float | None = None, accept: str = "application/json", body: Any = None) -> bytes:
        """``body``: sent as JSON on POST/PUT (an empty body when None)."""
        url = self._full(self._base, path, query)
        headers = {"Accept": accept, "User-Agent": "memprof-otel-cli"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        elif self._basic_auth:
            headers["Authorization"] = self._basic_auth
        if method in ("POST", "PUT"):  # the endpoint refuses other content types there (415)
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(url, method=method, headers=headers,
                                     data=(b"" if body is None else json.dumps(body).encode())
                                     if method in ("POST", "PUT") else None)
        wait = self.timeout if timeout is None else timeout
        shown = self.url(path).split("?", 1)[0]
        try:
            with urllib.request.urlopen(req, timeout=wait) as resp:
                return resp.read()
        except urllib.error.HTTPError as e:
            try:
                body = e.read()
            except Exception:  # no body, or the connection died mid-body
                body = b""
            finally:
                e.close()
            hint = f" (pass --token, or set {TOKEN_ENV})" if e.code == 401 else ""
            code = EXIT_USAGE if e.code in _BAD_INPUT else EXIT_FAILURE
            raise CommandError(f"{method} {shown}: HTTP {e.code}: {_server_error(body)}{hint}", code) from None
        except urllib.error.URLError as e:
            reason = e.reason.strerror if isinstance(e.reason, OSError) and e.reason.strerror else e.reason
            if isinstance(e.reason, (TimeoutError, socket.timeout)):
                raise CommandError(f"{method} {shown}: no answer within {wait:g} s") from None
            raise CommandError(f"cannot reach {self.base}: {reason}") from None
        except (TimeoutError, socket.timeout):
            raise CommandError(f"{method} {shown}: no answer within {wait:g} s") from None
        except (http.client.HTTPException, ConnectionError) as e:
            raise CommandError(f"cannot reach {self.base}: {type(e).__name__}: {e}") from None

    def json(self, method: str, path: str, query: Mapping[str, Any] | None = None,
             timeout: float | None = None, body: Any = None) -> Any:
        answer = self.request(method, path, query, timeout, body=body)
        try:
            return json.loads(answer)
        except (ValueError, UnicodeDecodeError):
            raise CommandError(f"{method} {self.url(path)}: the answer is not JSON "
                               "(is this a memprof-otel endpoint?)") from None
