"""Ask a running endpoint about the processes of its service that ended without a clean shutdown:
why (``oom_kill``, ``killed``, ``exited``) and on what evidence, the cause of an OOM kill with the
knob to change, the forwards in flight (model, shape, layer) and the memory of their last seconds.

Example: ``memprof-otel postmortem --url http://127.0.0.1:9464``; ``--json`` prints the
endpoint's document. Exits 3 when one of them was OOM-killed (a CI or a canary can act on it).
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ..units import format_bytes
from ._common import Client, add_endpoint_arguments

EXIT_OOM_KILLED = 3


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_endpoint_arguments(p)
    p.add_argument("--json", action="store_true", help="print the endpoint's JSON document")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the endpoint")


def run(args: argparse.Namespace) -> int:
    doc = Client(args.url, args.token, args.timeout).json("GET", "/v1/postmortem", {})
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(render(doc))
    return EXIT_OOM_KILLED if any(p.get("reason") == "oom_kill" for p in doc.get("postmortems", ())) else 0


def _when(t: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if isinstance(t, (int, float)) else "unknown"


def _peak(samples: list[dict[str, Any]]) -> str:
    rss = [s.get("process", {}).get("resident_memory_bytes") for s in samples]
    usage = [s.get("container", {}).get("memory_usage_bytes") for s in samples]
    parts = []
    if any(isinstance(v, (int, float)) for v in rss):
        parts.append(f"RSS peak {format_bytes(int(max(v for v in rss if isinstance(v, (int, float)))))}")
    if any(isinstance(v, (int, float)) for v in usage):
        parts.append(f"cgroup usage peak {format_bytes(int(max(v for v in usage if isinstance(v, (int, float)))))}")
    return ", ".join(parts)


def render(doc: dict[str, Any]) -> str:
    pms = doc.get("postmortems") or []
    lines: list[str] = []
    if not pms:
        lines.append("no process of this service ended without a clean shutdown"
                     + ("" if doc.get("recording", True) else f" (black box off: {doc.get('disabled_reason')})"))
    for p in pms:
        limit = p.get("limit_bytes")
        lines.append(f"pid {p.get('pid')}: {p.get('reason')} at about {_when(p.get('ended_unix'))} "
                     f"(evidence: {', '.join(p.get('evidence') or ())})"
                     + (f"; limit {format_bytes(limit)}" if isinstance(limit, int) else ""))
        for f in p.get("in_flight") or []:
            shape = " ".join(f"{k}={v}" for k, v in sorted((f.get("features") or {}).items())) or "no shape"
            lines.append(f"  in flight: {f.get('model')} [{shape}] in layer {f.get('layer') or '(root)'}"
                         + (f", operation {f['operation']}" if f.get("operation") else "")
                         + (" — the limit was reached during it" if f.get("limit_reached") else ""))
        cause = p.get("cause")
        if isinstance(cause, dict) and cause.get("cause"):
            lines.append(f"  cause: {cause['cause']}: {cause.get('summary', '')}")
            if cause.get("cause") != "unknown" and cause.get("knob"):
                lines.append(f"  knob: {cause['knob']}")
        samples = p.get("samples") or []
        if samples:
            lines.append(f"  {len(samples)} samples over its last {samples[-1]['t'] - samples[0]['t']:.1f} s: "
                         + _peak(samples))
        if p.get("dump_id"):
            lines.append(f"  stored as dump {p['dump_id']}")
    skipped = {k: v for k, v in (doc.get("skipped_files") or {}).items() if v}
    if skipped:
        lines.append("files skipped: " + ", ".join(f"{k} {v}" for k, v in sorted(skipped.items())))
    return "\n".join(lines)
