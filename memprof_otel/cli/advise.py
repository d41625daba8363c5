"""Ask a running endpoint for advice over what it measured, each item with the figures behind it.

Reads ``GET {url}/v1/advice`` and prints one block per advice: severity, id, title, the figures it
cites (in human units) and where they come from, the action, and the docs section. ``--json``
prints the endpoint's JSON document (its advice from ``--min-severity`` up). With ``--fail-on
SEVERITY`` the command exits 3 when any advice is at or above that severity, printed or not
(for CI or a readiness script); by default it never fails on advice.
"""
from __future__ import annotations

import argparse
import json
import textwrap
from typing import Any

from ..advice import SEVERITIES, severity_rank
from ..units import format_bytes
from ._common import EXIT_ADVICE, Client, CommandError, add_endpoint_arguments

WIDTH = 100


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_endpoint_arguments(p)
    p.add_argument("--model", default=None, help="only the advice about this model, its device and the process")
    p.add_argument("--min-severity", choices=SEVERITIES, default=SEVERITIES[0],
                   help="leave out advice below this severity")
    p.add_argument("--fail-on", choices=SEVERITIES, default=None,
                   help=f"exit {EXIT_ADVICE} when any advice is at or above this severity; unset, advice never fails "
                        "the command")
    p.add_argument("--json", action="store_true", help="print the endpoint's JSON document (its advice from --min-severity up)")


def figure(value: float, unit: str) -> str:
    """A cited figure in human units: bytes as KiB/MiB/GiB (with the exact count), ratios as %."""
    if unit == "bytes":
        return f"{format_bytes(value)} ({int(value):,} B)"
    if unit == "bytes_per_second":
        return f"{format_bytes(value)}/s"
    if unit == "ratio":
        return f"{value:.1%}"
    if unit == "seconds":
        return f"{value:g} s"
    return f"{value:g}"


def _wrapped(label: str, text: str) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=f"  {label}", subsequent_indent=" " * (2 + len(label)))


def render_one(a: dict[str, Any]) -> list[str]:
    ev = a["evidence"]
    where = ", ".join(f"{k} {ev[k]}" for k in ("model", "layer", "device", "limit") if ev.get(k))
    lines = [f"{a['severity'].upper():<8} {a['id']}: {a['title']}",
             f"  evidence from {ev['source']}{'; ' + where if where else ''}:"]
    figures = ev["figures"]
    width = max(len(k) for k in figures)
    lines += [f"    {k:<{width}}  {figure(f['value'], f['unit'])}" for k, f in figures.items()]
    lines += _wrapped("action: ", a["action"])
    lines.append(f"  docs: {a['docs']}")
    return lines


def render(doc: dict[str, Any]) -> str:
    advice = doc["advice"]
    scope = f" for model {doc['model']}" if doc.get("model") else ""
    if advice:
        lines = [f"{len(advice)} advice item{'s' if len(advice) != 1 else ''}{scope} "
                 f"(at or above {doc['min_severity']}):", ""]
        for a in advice:
            lines += render_one(a) + [""]
    elif doc["min_severity"] == SEVERITIES[0]:
        lines = [f"no advice{scope}: nothing measured calls for action", ""]
    else:  # below the floor there may be advice: not "nothing calls for action"
        lines = [f"no advice{scope} at or above {doc['min_severity']}", ""]
    if doc.get("notes"):
        lines.append("not checked:")
        for n in doc["notes"]:
            lines += textwrap.wrap(n, WIDTH, initial_indent="  - ", subsequent_indent="    ")
    return "\n".join(lines).rstrip("\n")


def _at_or_above(advice: list[dict[str, Any]], severity: str) -> list[dict[str, Any]]:
    floor = severity_rank(severity)
    return [a for a in advice if a.get("severity") in SEVERITIES and severity_rank(a["severity"]) >= floor]


def run(args: argparse.Namespace) -> int:
    client = Client(args.url, args.token)
    # --fail-on judges every advice at or above it, whatever --min-severity leaves out of the print:
    # ask for the lower of the two floors, print from --min-severity up
    ask = min(args.min_severity, args.fail_on or args.min_severity, key=severity_rank)
    doc = client.json("GET", "/v1/advice", {"model": args.model, "min_severity": ask})
    if not isinstance(doc, dict) or not isinstance(doc.get("advice"), list):
        raise CommandError(f"GET {client.url('/v1/advice')}: not an advice document: {json.dumps(doc)[:200]}")
    shown = {**doc, "advice": _at_or_above(doc["advice"], args.min_severity), "min_severity": args.min_severity}
    print(json.dumps(shown, indent=2) if args.json else render(shown))
    if args.fail_on is not None and _at_or_above(doc["advice"], args.fail_on):
        return EXIT_ADVICE
    return 0
