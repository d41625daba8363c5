"""Save a running endpoint's per-layer figures of one model as a baseline file.

``memprof-otel baseline save --url URL --model M -o FILE`` asks the endpoint for a measuring window
(``POST /v1/baseline``): its next ``--forwards`` model forwards (100) are attributed, whatever the
sampling, and kept per input shape, within ``--timeout`` seconds (60). The file holds, per shape,
each layer's median over that shape's forwards and their spread, which ``memprof-otel diff``
compares like with like (docs/reference.md, "Baselines"). While the window is open every model
forward pays what an attributed forward costs; the command prints what it cost.

``--since-start`` writes instead the endpoint's figures since it started (``GET /v1/layers``):
maxima over whatever forwards the sampling attributed, of whatever shapes, with no per-shape part.
"""
from __future__ import annotations

import argparse
import dataclasses

from ..baselines import BaselineError, from_dict, from_layers_document, save
from ..http.guards import BASELINE_FORWARDS, BASELINE_TIMEOUT
from ._common import EXIT_USAGE, Client, CommandError, add_endpoint_arguments, check_bounds


def _pairs(values: list[str] | None, option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values or []:
        key, sep, value = v.partition("=")
        if not sep or not key.strip():
            raise CommandError(f"{option} {v!r}: expected NAME=VALUE (e.g. {option} batch=8)", EXIT_USAGE)
        out[key.strip()] = value.strip()
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("save",), help="save: write the endpoint's baseline of --model to -o FILE")
    add_endpoint_arguments(p)
    p.add_argument("--model", default=None, help="the model (may be left out when the endpoint has one)")
    p.add_argument("-o", "--output", required=True, help="the baseline file to write")
    p.add_argument("--forwards", type=int, default=BASELINE_FORWARDS[0],
                   help=f"model forwards the measuring window attributes and keeps (default {BASELINE_FORWARDS[0]})")
    p.add_argument("--timeout", type=float, default=BASELINE_TIMEOUT[0],
                   help=f"seconds the window stays open at most (default {BASELINE_TIMEOUT[0]:g}); send the "
                        "traffic meanwhile")
    p.add_argument("--since-start", action="store_true",
                   help="write the figures since the endpoint started (GET /v1/layers) instead of a window: "
                        "maxima over the forwards the sampling attributed, no per-shape figures")
    p.add_argument("--input", action="append", metavar="NAME=VALUE",
                   help="describe the inputs the figures come from (repeatable), e.g. --input batch=8 "
                        "--input seq_len=512")
    p.add_argument("--env", action="append", metavar="NAME=VALUE",
                   help="an environment fact to record besides the endpoint's (repeatable), e.g. --env image=v1.4")


def run(args: argparse.Namespace) -> int:
    inputs, env = _pairs(args.input, "--input"), _pairs(args.env, "--env")
    client = Client(args.url, args.token)
    if args.since_start:
        doc = client.json("GET", "/v1/layers", {"model": args.model})
        try:
            baseline = from_layers_document(doc, args.model, inputs=inputs, environment=env)
        except BaselineError as e:
            raise CommandError(f"GET {client.url('/v1/layers')}: {e}", EXIT_USAGE) from None
        window = None
    else:
        check_bounds("forwards", args.forwards, BASELINE_FORWARDS)
        check_bounds("timeout", args.timeout, BASELINE_TIMEOUT)
        body = {"forwards": args.forwards, "timeout": args.timeout}
        if args.model is not None:
            body["model"] = args.model
        doc = client.json("POST", "/v1/baseline", timeout=args.timeout + 30.0, body=body)
        window = doc.pop("window", None) if isinstance(doc, dict) else None
        try:
            baseline = from_dict(doc, f"POST {client.url('/v1/baseline')}")
        except BaselineError as e:
            raise CommandError(str(e), EXIT_USAGE) from None
        baseline = dataclasses.replace(baseline, inputs={**baseline.inputs, **inputs},
                                       environment={**baseline.environment, **env})
    save(baseline, args.output)
    print(f"wrote {args.output}: model {baseline.model}, {len(baseline.layers)} layers, "
          f"{baseline.forwards} forwards, fingerprint {baseline.fingerprint}")
    if window is not None:
        shapes = ", ".join(f"{'/'.join(f'{k}={v}' for k, v in sorted(s.features.items())) or 'shape not read'}"
                           f" x{s.forwards}" for s in baseline.shapes)
        print(f"window: {window.get('forwards_kept')} of {window.get('forwards_requested')} forwards in "
              f"{window.get('seconds')} s, every one attributed (it cost the service "
              f"{window.get('overhead_seconds')} s); shapes: {shapes}")
        if not window.get("complete"):
            print(f"note: the window closed at --timeout {args.timeout:g} s before {args.forwards} forwards: "
                  "send more traffic, or fewer --forwards")
    return 0
