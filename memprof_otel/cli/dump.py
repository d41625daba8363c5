"""Deep-capture the next forwards of a running model and download the speedscope file.

``POST {url}/v1/dumps`` waits until the capture completes (201 with the dump's id), then
``GET /v1/dumps/{id}`` downloads it; the file is written atomically (never half a file).
Open it at https://www.speedscope.app.
"""
from __future__ import annotations

import argparse
import json
import urllib.parse

from ..files import write_bytes_atomic
from ._common import Client, CommandError

HELP = "trigger a deep capture on a running endpoint and download it (speedscope JSON)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="the memprof-otel endpoint, e.g. http://127.0.0.1:9464")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="where to write the dump")
    p.add_argument("--token", default=None, help="bearer token, when the endpoint has one")
    p.add_argument("--model", default=None, help="model name (needed when several are instrumented)")
    p.add_argument("--forwards", type=int, default=1, help="forwards to capture (1..1000)")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds to wait for those forwards to happen")


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.forwards <= 1000:
        raise CommandError(f"--forwards must be between 1 and 1000, got {args.forwards}", 2)
    if not 0 < args.timeout <= 600:
        raise CommandError(f"--timeout must be in (0, 600] seconds, got {args.timeout:g}", 2)
    client = Client(args.url, args.token)
    info = client.json("POST", "/v1/dumps",
                       {"kind": "speedscope", "forwards": args.forwards, "timeout": args.timeout,
                        "model": args.model},
                       timeout=args.timeout + 15.0)  # the server answers once the capture is done
    dump_id = info.get("id") if isinstance(info, dict) else None
    if not isinstance(dump_id, str) or not dump_id:
        raise CommandError(f"POST {client.url('/v1/dumps')}: no dump id in the answer: {info!r:.200}")
    where = info.get("url", "")
    path = where if where.startswith(("http://", "https://")) else \
        "/v1/dumps/" + urllib.parse.quote(dump_id, safe="")  # relative to --url (it may be mounted)
    body = client.request("GET", path, timeout=60.0)
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise CommandError(f"GET {client.url(path)}: the dump is not JSON") from None
    write_bytes_atomic(body, args.output)
    frames = len(doc.get("shared", {}).get("frames", [])) if isinstance(doc, dict) else 0
    print(f"wrote {args.output}: dump {dump_id}, {len(body)} bytes, {frames} frames "
          f"(open it at https://www.speedscope.app)")
    return 0
