"""Ask a running endpoint how much more fits: the largest safe batch per sequence length, or
whether one shape fits now.

Examples: ``memprof-otel headroom --url http://127.0.0.1:9464`` prints each model's table;
``memprof-otel headroom --url ... --model gpt2 --batch 16 --seq-len 1024`` predicts that shape and
exits 3 when it would not fit (scripts and canaries can act on it).
"""
from __future__ import annotations

import argparse
import json
from typing import Any

from ..units import format_bytes
from ._common import Client, add_endpoint_arguments

EXIT_WOULD_NOT_FIT = 3


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_endpoint_arguments(p)
    p.add_argument("--model", default=None, help="model name (all when absent)")
    p.add_argument("--batch", type=int, default=None, help="batch size of the shape to predict")
    p.add_argument("--seq-len", type=int, default=None, help="sequence length of the shape to predict")
    p.add_argument("--cache-len", type=int, default=None, help="tokens already in the KV cache")
    p.add_argument("--json", action="store_true", help="print the endpoint's JSON document")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the endpoint")


def run(args: argparse.Namespace) -> int:
    query = {"model": args.model, "batch": args.batch, "seq_len": args.seq_len, "cache_len": args.cache_len}
    doc = Client(args.url, args.token, args.timeout).json("GET", "/v1/headroom", query)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(render(doc))
    asked = any(v is not None for v in (args.batch, args.seq_len, args.cache_len))
    if asked and any(m.get("fits") is False for m in doc.get("models", {}).values()):
        return EXIT_WOULD_NOT_FIT
    return 0


def _pct(v: Any) -> str:
    return "unknown" if v is None else f"{100 * v:.1f} %"


def render(doc: dict[str, Any]) -> str:
    lines: list[str] = []
    if not doc.get("models"):
        return doc.get("reason", "no model is instrumented")
    for name, m in sorted(doc["models"].items()):
        lines.append(f"model {name}" + (f" on {m['device']}" if m.get("device") else ""))
        if not m.get("enabled"):
            lines.append(f"  {m.get('reason', 'the memory model is off')}")
            continue
        b = m.get("budget")
        if b is not None:
            lines.append(f"  limit: {format_bytes(b['limit_bytes'])} ({b['limit']}); usable "
                         f"{format_bytes(b['usable_bytes'])} after {format_bytes(b['held_elsewhere_bytes'])} held "
                         f"elsewhere and a {format_bytes(b['margin_bytes'])} margin; in use "
                         f"{format_bytes(b['in_use_bytes'])}; available {format_bytes(b['available_bytes'])}")
        else:
            lines.append(f"  limit: unknown ({m.get('budget_reason')})")
        fit = m.get("model_fit", {})
        for regime, st in sorted(fit.get("regimes", {}).items()):
            state = (f"error {_pct(st['error_ratio'])} on shapes left out" if st.get("reason") is None
                     else st["reason"])
            lines.append(f"  {regime}: {st['shapes']} shapes; {state}")
        if not fit.get("regimes"):
            lines.append("  no forward measured yet")
        p = m.get("prediction")
        if p is not None:
            feats = ", ".join(f"{k}={v}" for k, v in sorted(p["features"].items()))
            if p["peak_increase_bytes"] is None:
                lines.append(f"  {feats}: no prediction: {p['reason']}")
            else:
                verdict = {True: "fits", False: "would NOT fit", None: "unknown whether it fits"}[m.get("fits")]
                lines.append(f"  {feats}: peak +{format_bytes(p['peak_increase_bytes'])} "
                             f"(error {_pct(p['error_ratio'])}, up to +{format_bytes(p['upper_bytes'] or 0)}): "
                             f"{verdict}" + (f", headroom {format_bytes(m['headroom_bytes'])}"
                                             if "headroom_bytes" in m else ""))
                if p["extrapolates"]:
                    far = ", ".join(f"{k} {v}x" for k, v in sorted(p["extrapolation"].items()))
                    lines.append(f"    extrapolates beyond the shapes seen: {far}")
            if p.get("data_dependent"):
                lines.append("    warning: forwards of one shape had very different peaks (data-dependent)")
        table = m.get("max_safe_batch")
        if table:
            lines.append("  max safe batch: " + ", ".join(f"seq_len {k}: {v}" for k, v in
                                                          sorted(table.items(), key=lambda kv: int(kv[0]))))
        if m.get("max_safe_seq_len"):
            ms = m["max_safe_seq_len"]
            lines.append(f"  max safe seq_len at batch {ms['batch']}: {ms['seq_len']}")
    return "\n".join(lines)
