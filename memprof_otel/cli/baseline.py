"""Save a running endpoint's per-layer figures of one model as a baseline file.

``memprof-otel baseline save --url URL --model M -o FILE`` reads ``GET {url}/v1/layers`` (the
figures, the layers' structure and the environment the endpoint measured them in) and writes the
baseline JSON (docs/reference.md, "Baselines"), which ``memprof-otel diff`` compares with another.
The figures are the endpoint's since it started (or since its figures were reset): maxima over every
attributed forward, so save after the traffic whose memory the baseline should stand for.
"""
from __future__ import annotations

import argparse

from ..baselines import BaselineError, from_layers_document, save
from ._common import EXIT_USAGE, Client, CommandError, add_endpoint_arguments


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
    p.add_argument("--input", action="append", metavar="NAME=VALUE",
                   help="describe the inputs the figures come from (repeatable), e.g. --input batch=8 "
                        "--input seq_len=512")
    p.add_argument("--env", action="append", metavar="NAME=VALUE",
                   help="an environment fact to record besides the endpoint's (repeatable), e.g. --env image=v1.4")


def run(args: argparse.Namespace) -> int:
    inputs, env = _pairs(args.input, "--input"), _pairs(args.env, "--env")
    client = Client(args.url, args.token)
    doc = client.json("GET", "/v1/layers", {"model": args.model})
    try:
        baseline = from_layers_document(doc, args.model, inputs=inputs, environment=env)
    except BaselineError as e:
        raise CommandError(f"GET {client.url('/v1/layers')}: {e}", EXIT_USAGE) from None
    save(baseline, args.output)
    print(f"wrote {args.output}: model {baseline.model}, {len(baseline.layers)} layers, "
          f"{baseline.forwards} forwards, fingerprint {baseline.fingerprint}")
    return 0
