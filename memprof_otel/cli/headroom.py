"""Ask a running endpoint how much more fits: the largest safe batch per sequence length, or
whether one shape fits now.

Examples: ``memprof-otel headroom --url http://127.0.0.1:9464`` prints each model's table;
``memprof-otel headroom --url ... --model gpt2 --batch 16 --seq-len 1024`` predicts that shape and
exits 3 when it would not fit, 4 when it cannot tell yet (too few shapes seen, no limit known), so a
script gating on the exit status never takes "cannot tell" for "fits".
"""
from __future__ import annotations

import argparse
import json
from typing import Any, Callable

from ..units import format_bytes
from ._common import Client, add_endpoint_arguments

EXIT_WOULD_NOT_FIT = 3
EXIT_CANNOT_ANSWER = 4  # a shape was asked about and the model or the limit cannot answer yet


def _at_least(lo: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``lo`` (a batch of 0 is no shape)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be at least {lo}, got {v}")
        return v
    return parse


def _feature(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, _at_least(0)(value)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_endpoint_arguments(p)
    p.add_argument("--model", default=None, help="model name (all when absent)")
    p.add_argument("--batch", type=_at_least(1), default=None, help="batch size of the shape to predict")
    p.add_argument("--seq-len", type=_at_least(1), default=None, help="sequence length of the shape to predict")
    p.add_argument("--cache-len", type=_at_least(0), default=None, help="tokens already in the KV cache")
    p.add_argument("--feature", type=_feature, action="append", default=[], metavar="NAME=VALUE",
                   help="another shape feature (the names a model's shape_of gives); repeatable")
    p.add_argument("--json", action="store_true", help="print the endpoint's JSON document")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the endpoint")


def run(args: argparse.Namespace) -> int:
    query: dict[str, Any] = {"model": args.model, "batch": args.batch, "seq_len": args.seq_len,
                             "cache_len": args.cache_len, **dict(args.feature)}
    doc = Client(args.url, args.token, args.timeout).json("GET", "/v1/headroom", query)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(render(doc))
    return exit_code(doc, asked=any(v is not None for k, v in query.items() if k != "model"))


def exit_code(doc: dict[str, Any], asked: bool) -> int:
    """0: fits (or only the table was asked for); 3: would not fit; 4: cannot tell yet."""
    if not asked:
        return 0
    answers = [m.get("fits") if m.get("enabled") else None for m in doc.get("models", {}).values()]
    if any(a is False for a in answers):
        return EXIT_WOULD_NOT_FIT
    if not answers or any(a is None for a in answers):
        return EXIT_CANNOT_ANSWER
    return 0


def _factor(v: Any) -> str:
    return "unbounded" if v is None else f"{v:g}x"


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
        if m.get("note"):
            lines.append(f"  note: {m['note']}")
        p = m.get("prediction")
        if p is not None:
            feats = ", ".join(f"{k}={v}" for k, v in sorted(p["features"].items()))
            verdict = {True: "fits", False: "would NOT fit", None: "unknown whether it fits"}[m.get("fits")]
            if p["peak_increase_bytes"] is None:
                lines.append(f"  {feats}: no prediction: {p['reason']}")
            else:
                if p["upper_bytes"] is None:  # past capacity.max_extrapolation: the estimate alone
                    lines.append(f"  {feats}: {p['reason']}; the fit's estimate is "
                                 f"+{format_bytes(p.get('estimate_bytes') or 0)}: {verdict}")
                else:
                    lines.append(f"  {feats}: peak +{format_bytes(p['peak_increase_bytes'])} "
                                 f"(error {_pct(p['error_ratio'])}, up to +{format_bytes(p['upper_bytes'])}): "
                                 f"{verdict}" + (f", headroom {format_bytes(m['headroom_bytes'])}"
                                                 if "headroom_bytes" in m else ""))
                if p["extrapolates"]:
                    far = ", ".join(f"{k} {_factor(v)}" for k, v in sorted(p["extrapolation"].items()))
                    lines.append(f"    extrapolates {_factor(p.get('extrapolation_factor'))} beyond the shapes seen "
                                 f"({far}): the error grows with the distance")
                if m.get("fits") is None and m.get("budget") is None:
                    lines.append(f"    no limit known: {m.get('budget_reason')}")
            if p.get("data_dependent"):
                lines.append("    warning: forwards of one shape had very different peaks (data-dependent)")
        rows = m.get("max_safe_batch_rows")
        if rows:
            call = m.get("table_call") or {}
            lines.append("  max safe batch" + (f" ({call['text']})" if call.get("text") else "") + ":")
            for r in rows:
                where = "any length" if r["seq_len"] is None else f"seq_len {r['seq_len']}"
                if r["batch"] is None:
                    lines.append(f"    {where}: {r['reason']}")
                    continue
                far = r.get("extrapolation_factor")
                out = (f", {_factor(far)} outside the shapes seen" if far is None or far > 1 else "")
                lines.append(f"    {where}: {r['batch']} (error {_pct(r['error_ratio'])}{out})")
        elif m.get("max_safe_batch_reason") and p is None:
            lines.append(f"  max safe batch: not known: {m['max_safe_batch_reason']}")
        ms = m.get("max_safe_seq_len")
        if ms:
            told = ms["seq_len"] if ms["seq_len"] is not None else f"not known ({ms.get('reason')})"
            lines.append(f"  max safe seq_len at batch {ms['batch']}: {told}")
    return "\n".join(lines)
