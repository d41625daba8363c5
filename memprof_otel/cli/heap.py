"""Trace a running process's Python heap for some seconds and print where it grew.

``POST {url}/v1/heap`` runs tracemalloc in the served process for ``--seconds``, then answers the
allocation sites whose live memory grew most (``file:line`` of the allocating frame, bytes and
blocks); the growth is also stored there as a speedscope file (``-o`` downloads it; ``--format
pprof`` as a gzipped pprof ``Profile``).
"""
from __future__ import annotations

import argparse
import json
import urllib.parse
from typing import Any

from ..files import write_bytes_atomic
from ..http.guards import HEAP_FRAMES, HEAP_SECONDS, HEAP_TOP
from ..units import format_bytes
from ._common import EXIT_USAGE, Client, CommandError, add_endpoint_arguments
from .dump import add_format_argument, download

ANSWER_MARGIN_S = 60.0  # after the traced seconds: two snapshots, the diff and the stored file


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_endpoint_arguments(p)
    p.add_argument("--seconds", required=True, type=float,
                   help=f"seconds to trace ({HEAP_SECONDS[1]:g}..{HEAP_SECONDS[2]:g})")
    p.add_argument("--top", type=int, default=HEAP_TOP[0], help=f"sites to show ({HEAP_TOP[1]}..{HEAP_TOP[2]})")
    p.add_argument("--frames", type=int, default=HEAP_FRAMES[0],
                   help=f"frames kept per traceback ({HEAP_FRAMES[1]}..{HEAP_FRAMES[2]})")
    p.add_argument("--tracebacks", action="store_true", help="print each site's traceback too")
    p.add_argument("--json", action="store_true", help="print the endpoint's JSON answer as it is")
    p.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="also download the flame graph of the growth to FILE")
    add_format_argument(p)


def _check(name: str, value: float, limits: tuple[float, float, float]) -> None:
    if not limits[1] <= value <= limits[2]:  # NaN fails this too
        raise CommandError(f"--{name} must be between {limits[1]:g} and {limits[2]:g}, got {value:g}", EXIT_USAGE)


def _signed_bytes(n: int) -> str:
    return ("+" if n >= 0 else "") + format_bytes(n)


def render(doc: dict[str, Any], tracebacks: bool = False) -> str:
    """The endpoint's answer for people: a summary line, then one row per site."""
    tracing = ("the process already traced: its tracing was reused and left on" if doc["tracing_was_on"]
               else "tracing was started for this diff and stopped after it")
    lines = [f"Python heap growth over {doc['elapsed_seconds']:.1f} s: {_signed_bytes(doc['growth_bytes'])} "
             f"at {doc['sites_grown']} sites (net {_signed_bytes(doc['net_bytes'])}; traced "
             f"{format_bytes(doc['traced_bytes_before'])} -> {format_bytes(doc['traced_bytes_after'])})",
             f"{doc['frames']} frames per traceback; {tracing}"
             + ("; stopped early: the process shut down" if doc["stopped_early"] else "")]
    dump = doc.get("dump")
    lines.append(f"speedscope file: dump {dump['id']}" if dump else f"speedscope file: not stored ({doc['dump_error']})")
    sites = doc["sites"]
    if not sites:
        lines.append("no Python allocation site grew")
        return "\n".join(lines)
    lines.append("")
    lines.append(f"{'#':>3}  {'growth':>11}  {'blocks':>9}  allocated at")
    for i, s in enumerate(sites, 1):
        lines.append(f"{i:>3}  {_signed_bytes(s['size_diff_bytes']):>11}  {s['count_diff']:>+9,}  {s['site']}")
        if tracebacks:
            if s["traceback_at_limit"]:
                lines.append(f"{'':>27}... (frame limit: older frames not traced)")
            lines.extend(f"{'':>27}{f['file']}:{f['line']}" for f in s["traceback"])
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    _check("seconds", args.seconds, HEAP_SECONDS)
    _check("top", args.top, HEAP_TOP)
    _check("frames", args.frames, HEAP_FRAMES)
    client = Client(args.url, args.token)
    doc = client.json("POST", "/v1/heap", body={"seconds": args.seconds, "top": args.top, "frames": args.frames},
                      timeout=args.seconds + ANSWER_MARGIN_S)
    if not isinstance(doc, dict) or not isinstance(doc.get("sites"), list):
        raise CommandError(f"POST {client.url('/v1/heap')}: not a heap diff: {json.dumps(doc)[:200]}")
    if args.output:
        dump = doc.get("dump")
        if not dump:
            raise CommandError(f"the endpoint could not store the speedscope file: {doc.get('dump_error')}")
        body = download(client, "/v1/dumps/" + urllib.parse.quote(dump["id"], safe=""), args.format)
        write_bytes_atomic(body, args.output)
    print(json.dumps(doc, indent=2) if args.json else render(doc, args.tracebacks))
    if args.output and not args.json:
        print(f"wrote {args.output} (" + (f"go tool pprof {args.output}" if args.format == "pprof"
                                          else "open it at https://www.speedscope.app") + ")")
    return 0
