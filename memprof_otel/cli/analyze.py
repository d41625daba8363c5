"""Print the layer summary and the operations report of a timeline JSON; optionally plot it.

Reads what ``h.export_timeline(path)`` writes (layer summary + samples + operations) or what
``GET /v1/timeline`` answers (samples + operations). ``--png`` draws the 4-panel plot (needs the
``plots`` extra).
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Any, Mapping

from ..reports.plot import plot_timeline
from ..reports.summary import overhead_line
from ..reports.text import format_report
from ..timeline import OperationRecord, Sample, Timeline
from ..units import format_bytes
from ._common import EXIT_USAGE, CommandError



def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("timeline", metavar="TIMELINE.json", help="timeline file")
    p.add_argument("--png", metavar="FILE", default=None, help="also write the 4-panel plot here")
    p.add_argument("--top", type=int, default=15, help="layers shown in the summary")


def load(path: str) -> dict[str, Any]:
    """The JSON document, checked to be a timeline; CommandError (exit 2) otherwise."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise CommandError(f"{path}: cannot read: {e.strerror or e}", EXIT_USAGE) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise CommandError(f"{path}: not valid JSON: {e}", EXIT_USAGE) from None
    except RecursionError:
        raise CommandError(f"{path}: not valid JSON: nested too deeply", EXIT_USAGE) from None
    if not isinstance(doc, dict) or not any(k in doc for k in ("samples", "operations", "layer_stats")):
        raise CommandError(f"{path}: not a memprof-otel timeline (expected the JSON of export_timeline() "
                           "or GET /v1/timeline)", EXIT_USAGE)
    return doc


def parse_records(doc: Mapping[str, Any], path: str) -> tuple[list[Any], list[Any]]:
    try:
        samples = [Sample.from_dict(s) for s in doc.get("samples") or []]
        ops = [OperationRecord.from_dict(o) for o in doc.get("operations") or []]
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CommandError(f"{path}: malformed samples or operations ({type(e).__name__}: {e})",
                           EXIT_USAGE) from None
    return samples, ops


def format_layers(doc: Mapping[str, Any], top: int) -> str | None:
    """The layer table from ``summary`` and ``layer_stats`` (None when the file has neither)."""
    summary, stats = doc.get("summary"), doc.get("layer_stats")
    if not isinstance(summary, dict) and not isinstance(stats, dict):
        return None
    s = summary if isinstance(summary, dict) else {}
    lines = [f"LAYERS: model {s.get('model', doc.get('model', '?'))!r} on {s.get('device', '?')} "
             f"({s.get('method', '?')})"]
    if s:
        steady = s.get("steady_overhead_ratio", s.get("overhead_ratio"))  # older files: the total
        lines.append(overhead_line(int(s.get("forwards", 0)), int(s.get("attributed_forwards", 0)),
                                   None if steady is None else float(steady),
                                   float(s.get("first_forward_overhead_seconds", 0.0))))
        lines.append(f"  forward peak: +{format_bytes(s.get('forward_peak_increase_bytes', 0))}")
    rows = sorted(((k, v) for k, v in (stats or {}).items() if k and isinstance(v, dict)),
                  key=lambda kv: kv[1].get("peak_increase", 0), reverse=True)[:max(0, top)]
    if not rows:
        lines.append("  no attributed layer")
        return "\n".join(lines)
    width = max(24, *(len(k) for k, _ in rows))
    lines.append(f"  {'layer':<{width}} {'calls':>6} {'peak +':>11} {'retained':>11} {'ms/call':>9}")
    for k, v in rows:
        calls = int(v.get("calls", 0))
        lines.append(f"  {k:<{width}} {calls:>6} {format_bytes(v.get('peak_increase', 0)):>11} "
                     f"{format_bytes(v.get('retained', 0)):>11} "
                     f"{float(v.get('duration_ms', 0.0)) / max(1, calls):>9.3f}")
    return "\n".join(lines)


def _require_matplotlib() -> None:
    """Before anything is read or printed: a plot asked for without the ``plots`` extra is a usage
    error (exit 2), not a report followed by a traceback."""
    try:
        import matplotlib  # noqa: F401  # why: an optional extra; only probed when --png asks for it
    except ImportError:
        raise CommandError("--png needs matplotlib, which is not installed: "
                           "pip install 'memprof-otel[plots]'", EXIT_USAGE) from None


def run(args: argparse.Namespace) -> int:
    if args.png:
        _require_matplotlib()
    doc = load(args.timeline)
    samples, ops = parse_records(doc, args.timeline)
    # every figure is read while the text is built, before a line is printed: a field of the wrong
    # type (a hand-edited or foreign file) is bad input, one line and exit 2, not half a report
    try:
        layers = format_layers(doc, args.top)
        report = format_report(samples, ops)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError, RecursionError) as e:
        raise CommandError(f"{args.timeline}: a figure of the wrong type or value "
                           f"({type(e).__name__}: {str(e)[:120]})", EXIT_USAGE) from None
    if layers:
        print(layers)
        print()
    print(report)
    if args.png:
        plot_timeline(Timeline.from_samples(samples, ops), args.png)
        print(f"\nplot written to {os.fspath(args.png)}")
    return 0
