"""Trace a running process's Python heap for some seconds and print where it grew.

``POST {url}/v1/heap`` runs tracemalloc in the served process for ``--seconds``, then answers the
allocation sites whose live memory grew most (``file:line`` of the allocating frame, bytes and
blocks); the growth is also stored there as a speedscope file (``-o`` downloads it; ``--format
pprof`` as a gzipped pprof ``Profile``).
"""
from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from typing import Any

from ..http.guards import HEAP_FRAMES, HEAP_SECONDS, HEAP_TOP
from ..units import format_bytes
from ._common import EXIT_USAGE, Client, CommandError, add_endpoint_arguments, check_bounds
from ._output import STDOUT, check_output, shown, write_output
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
                   help="also download the flame graph of the growth to FILE (- for standard output: "
                        "the report then goes to stderr)")
    add_format_argument(p)


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
    check_bounds("seconds", args.seconds, HEAP_SECONDS)
    check_bounds("top", args.top, HEAP_TOP)
    check_bounds("frames", args.frames, HEAP_FRAMES)
    if args.format == "pprof" and not args.output:  # a binary file, for a file or a pipe: not printed
        raise CommandError("--format pprof needs -o FILE (or -o - for standard output)", EXIT_USAGE)
    if args.output == STDOUT and args.json:
        raise CommandError("--json and -o - would both write to standard output: pick one", EXIT_USAGE)
    if args.output:
        check_output(args.output, binary=args.format == "pprof")
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
        write_output(body, args.output)
    # with -o -, standard output is the flame graph alone: the report goes to stderr
    report = sys.stderr if args.output == STDOUT else sys.stdout
    print(json.dumps(doc, indent=2) if args.json else render(doc, args.tracebacks), file=report)
    if args.output and not args.json:
        hint = "" if args.output == STDOUT else (f" (go tool pprof {args.output})" if args.format == "pprof"
                                                 else " (open it at https://www.speedscope.app)")
        print(f"wrote {shown(args.output)}{hint}", file=report)
    return 0
