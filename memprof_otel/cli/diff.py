"""Compare two baseline files: the layers whose figures changed, ranked by bytes, and a CI gate.

``memprof-otel diff OLD NEW`` prints the changed figures (largest first, with the relative change),
the layers renamed (matched by structure), added and removed, and what differs in the environment
and inputs. With ``--fail-above 2%`` (a layer's peak increase or retained bytes grew by more than 2 %)
and/or ``--fail-above-bytes 64KiB`` (by more than that; with both, by more than both) it exits 3
when a figure exceeds them, as ``advise --fail-on`` does, and 0 otherwise. ``--markdown`` prints
the same for a pull-request comment; ``--json`` the whole diff.
"""
from __future__ import annotations

import argparse
import json

from ..baselines import Baseline, Thresholds, diff, load, parse_fail_above
from ..baselines.render import markdown, text
from ..units import parse_bytes
from ._common import EXIT_ADVICE, EXIT_USAGE, CommandError


def parse_percent(value: str) -> float:
    """``2%`` -> 0.02, through ``baselines.parse_fail_above`` (the plugin's ``fail_above`` reads the
    same): a bare number is refused, since 0.02 reads as 2 % to some and 0.02 % to others."""
    try:
        return parse_fail_above(value, "--fail-above")
    except ValueError as e:
        raise CommandError(str(e), EXIT_USAGE) from None


def _load(path: str) -> Baseline:
    try:
        return load(path)
    except OSError as e:  # a missing or unreadable file is bad input: exit 2, one line
        raise CommandError(f"{path}: cannot read the baseline: {e.strerror or e}", EXIT_USAGE) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("old", help="the baseline to compare against (e.g. the one stored in the repository)")
    p.add_argument("new", help="the baseline of the build under test")
    p.add_argument("--fail-above", default=None, metavar="PERCENT",
                   help=f"exit {EXIT_ADVICE} when a layer's peak increase or retained bytes grew by more than "
                        "this (e.g. 2%%)")
    p.add_argument("--fail-above-bytes", default=None, metavar="SIZE",
                   help=f"exit {EXIT_ADVICE} when one grew by more than this many bytes (e.g. 64KiB); with "
                        "--fail-above, a figure must exceed both")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print the diff as JSON")
    form.add_argument("--markdown", action="store_true", help="print the diff as markdown (a PR comment)")


def run(args: argparse.Namespace) -> int:
    limits = Thresholds(fail_above=parse_percent(args.fail_above) if args.fail_above is not None else None,
                        fail_above_bytes=None)
    if args.fail_above_bytes is not None:
        try:
            limits = Thresholds(limits.fail_above, parse_bytes(args.fail_above_bytes))
        except ValueError as e:
            raise CommandError(f"--fail-above-bytes: {e}", EXIT_USAGE) from None
    result = diff(_load(args.old), _load(args.new), limits)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(markdown(result) if args.markdown else text(result), end="" if args.markdown else "\n")
    return EXIT_ADVICE if result.failed else 0
