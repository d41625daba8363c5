"""What the subcommands share: the typed command error and a small urllib client for the endpoint.

Only the standard library: ``memprof-otel dump`` and ``monitor`` must work wherever the package is
installed, with no extra dependency.
"""
from __future__ import annotations

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


def add_endpoint_arguments(p: Any) -> None:
    """``--url`` and ``--token``, the same on every subcommand that talks to a running endpoint."""
    p.add_argument("--url", required=True, help="the memprof-otel endpoint, e.g. http://127.0.0.1:9464")
    # the variable is read when the request is made, not as the default: --help never prints a secret
    p.add_argument("--token", default=None, help=f"bearer token, when the endpoint has one (default: ${TOKEN_ENV})")


def endpoint_url(url: str) -> str:
    """``url`` without a trailing slash; a CommandError (exit 2) unless it is http(s)://host[:port]."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise CommandError(f"--url must look like http://HOST:PORT, got {url!r}", EXIT_USAGE)
    return url.strip().rstrip("/")


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
        self.base = endpoint_url(url)
        self.token = token if token is not None else (os.environ.get(TOKEN_ENV) or None)
        self.timeout = timeout

    def url(self, path: str, query: Mapping[str, Any] | None = None) -> str:
        if path.startswith(("http://", "https://")):
            full = path
        else:
            full = self.base + "/" + path.lstrip("/")
        q = {k: v for k, v in (query or {}).items() if v is not None}
        return full + ("?" + urllib.parse.urlencode(q) if q else "")

    def request(self, method: str, path: str, query: Mapping[str, Any] | None = None,
                timeout: float | None = None, accept: str = "application/json", body: Any = None) -> bytes:
        """``body``: sent as JSON on POST/PUT (an empty body when None)."""
        url = self.url(path, query)
        headers = {"Accept": accept, "User-Agent": "memprof-otel-cli"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if method in ("POST", "PUT"):  # the endpoint refuses other content types there (415)
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(url, method=method, headers=headers,
                                     data=(b"" if body is None else json.dumps(body).encode())
                                     if method in ("POST", "PUT") else None)
        wait = self.timeout if timeout is None else timeout
        shown = url.split("?", 1)[0]
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
