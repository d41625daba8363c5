"""Deep-capture the next forwards of a running model and download the speedscope file.

``POST {url}/v1/dumps`` starts the capture and answers at once (202, the request's id); the
command then long-polls ``GET /v1/dumps/{request id}?wait=...`` until the request is complete or
failed, or ``--timeout`` plus a margin for storing has passed, and downloads the stored dump from
its ``url``. A file is written atomically (never half a file); ``-o -`` is standard output. Open it at
https://www.speedscope.app; with ``--format pprof`` the endpoint converts it to a gzipped pprof
``Profile`` (``go tool pprof FILE``, Pyroscope, Parca).
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
import urllib.parse
from typing import Any

from ._common import EXIT_USAGE, Client, CommandError, add_endpoint_arguments
from ._output import STDOUT, check_output, shown, write_output

STORE_MARGIN_S = 30.0  # beyond --timeout: building and storing the file once the forwards are in
POLL_WAIT_S = 20.0     # one long-poll; under the endpoint's cap and common proxy timeouts


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_endpoint_arguments(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="where to write the dump (- for standard output)")
    add_format_argument(p)
    p.add_argument("--model", default=None, help="model name (needed when several are instrumented)")
    p.add_argument("--forwards", type=int, default=1, help="forwards to capture (1..1000)")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds to wait for those forwards to happen")


FORMATS = ("speedscope", "pprof")


def add_format_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=FORMATS, default=FORMATS[0],
                   help="file format: speedscope JSON, or pprof (a gzipped pprof Profile)")


def download(client: Client, path: str, fmt: str) -> bytes:
    """A stored flame graph's bytes in ``fmt``, checked to be that format."""
    body = client.request("GET", path, {"format": fmt} if fmt != FORMATS[0] else None, timeout=60.0,
                          accept="application/octet-stream" if fmt == "pprof" else "application/json")
    if fmt == "pprof":
        try:
            gzip.decompress(body)
        except (OSError, EOFError):
            raise CommandError(f"GET {client.url(path)}: the dump is not a gzipped pprof file") from None
    else:
        try:
            json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise CommandError(f"GET {client.url(path)}: the dump is not JSON") from None
    return body


def _wait_for(client: Client, job: dict[str, Any], deadline: float) -> dict[str, Any]:
    job_id = job.get("id")
    if not isinstance(job_id, str) or not job_id:
        raise CommandError(f"POST {client.url('/v1/dumps')}: no request id in the answer: {job!r:.200}")
    status_path = "/v1/dumps/" + urllib.parse.quote(job_id, safe="")
    while job.get("status") == "pending":
        left = deadline - time.monotonic()
        if left <= 0:
            raise CommandError(f"dump request {job_id} still pending at the deadline; "
                               f"poll {client.url(status_path)} later")
        wait = min(POLL_WAIT_S, max(left, 0.5))
        job = client.json("GET", status_path, {"wait": f"{wait:.1f}"}, timeout=wait + 15.0)
        if not isinstance(job, dict):
            raise CommandError(f"GET {client.url(status_path)}: unexpected answer {job!r:.200}")
    if job.get("status") == "failed":
        raise CommandError(f"dump request {job_id} failed: {job.get('error') or 'error'}: "
                           f"{job.get('detail') or 'no detail'}")
    if job.get("status") != "complete" or not isinstance(job.get("dump"), dict):
        raise CommandError(f"GET {client.url(status_path)}: unexpected answer {job!r:.200}")
    return job["dump"]


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.forwards <= 1000:
        raise CommandError(f"--forwards must be between 1 and 1000, got {args.forwards}", EXIT_USAGE)
    if not 0 < args.timeout <= 600:
        raise CommandError(f"--timeout must be in (0, 600] seconds, got {args.timeout:g}", EXIT_USAGE)
    check_output(args.output, binary=args.format == "pprof")
    client = Client(args.url, args.token)
    deadline = time.monotonic() + args.timeout + STORE_MARGIN_S
    answer = client.json("POST", "/v1/dumps",
                         {"kind": "speedscope", "forwards": args.forwards, "timeout": args.timeout,
                          "model": args.model})
    if not isinstance(answer, dict):
        raise CommandError(f"POST {client.url('/v1/dumps')}: unexpected answer {answer!r:.200}")
    # an endpoint before 202-and-poll answered 201 with the stored dump itself
    info = _wait_for(client, answer, deadline) if "status" in answer else answer
    dump_id = info.get("id")
    if not isinstance(dump_id, str) or not dump_id:
        raise CommandError(f"POST {client.url('/v1/dumps')}: no dump id in the answer: {info!r:.200}")
    where = str(info.get("url", ""))
    path = where if where.startswith(("http://", "https://")) else \
        "/v1/dumps/" + urllib.parse.quote(dump_id, safe="")  # relative to --url (it may be mounted)
    body = download(client, path, args.format)
    write_output(body, args.output)
    # with -o -, standard output is the dump alone: the note goes to stderr
    note = sys.stderr if args.output == STDOUT else sys.stdout
    if args.format == "pprof":
        print(f"wrote {shown(args.output)}: dump {dump_id}, {len(body)} bytes, pprof"
              + ("" if args.output == STDOUT else f" (go tool pprof {args.output})"), file=note)
        return 0
    doc = json.loads(body)
    frames = len(doc.get("shared", {}).get("frames", [])) if isinstance(doc, dict) else 0
    print(f"wrote {shown(args.output)}: dump {dump_id}, {len(body)} bytes, {frames} frames "
          f"(open it at https://www.speedscope.app)", file=note)
    return 0
