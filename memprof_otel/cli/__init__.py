"""The ``memprof-otel`` command: one module per subcommand, each with ``add_arguments`` and ``run``.

Errors are typed: a ``CommandError`` carries its exit code; a ``ConfigError`` (bad input) exits 2;
any other ``MemprofError`` or ``OSError`` exits 1. Each is one line on stderr,
``memprof-otel: error: ...``, never a traceback (set ``MEMPROF_OTEL_DEBUG=1`` to see one).

``__main__.py`` ``python -m memprof_otel.cli``, the same as the console script
``_common.py`` what the subcommands share: the typed command error, a small client for the endpoint
``_output.py`` ``-o FILE`` of ``dump`` and ``heap``: checked before any request, then written
``advise.py`` ``advise``: the advice a running endpoint gives, each item with its figures
``analyze.py`` ``analyze``: the layer summary and operations report of a timeline JSON, or its plot
``baseline.py`` ``baseline save``: a running endpoint's per-layer figures of a model as a baseline file
``check_config.py`` ``check-config``: validate a YAML config file
``demo.py`` ``demo``: the example embeddings server under synthetic traffic
``diff.py`` ``diff``: two baseline files compared per layer, with a CI gate
``dump.py`` ``dump``: deep-capture a running model's next forwards and download the file
``headroom.py`` ``headroom``: how much more fits on a running endpoint
``heap.py`` ``heap``: trace a running process's Python heap and print where it grew
``info.py`` ``info``: the system, torch and its devices, NVML and the host allocator
``monitor.py`` ``monitor``: a live terminal view of a running endpoint
``postmortem.py`` ``postmortem``: why earlier processes of an endpoint's service ended

Public: the ``memprof-otel`` command, its subcommands, options and exit codes (docs/reference.md,
CLI). The module paths are internal.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import NoReturn, Sequence

from .._version import __version__
from ..errors import ConfigError, MemprofError
from ._common import EXIT_FAILURE, EXIT_USAGE, CommandError

PROG = "memprof-otel"
# subcommand -> (module in this package, one-line help). Only the module of the subcommand being run
# is imported (``memprof-otel dump`` never loads the config parser, NVML or the advice rules), so the
# help lines live here rather than in the modules.
COMMANDS: dict[str, tuple[str, str]] = {
    "info": ("info", "system, torch, devices, NVML and allocator facts (what memprof-otel can measure here)"),
    "check-config": ("check_config", "validate a config file (unknown keys, bad values and units, bad watchdog rules)"),
    "dump": ("dump", "trigger a deep capture on a running endpoint and download it (speedscope JSON)"),
    "heap": ("heap", "trace a running endpoint's Python heap for N seconds and print the top growing allocation sites"),
    "analyze": ("analyze", "report (and plot) a timeline JSON from export_timeline() or GET /v1/timeline"),
    "monitor": ("monitor", "live terminal view of a running endpoint (--once for a single frame)"),
    "advise": ("advise", "advice over what a running endpoint measured, each citing its figures (--fail-on for CI)"),
    "demo": ("demo", "run the instrumented example inference server with synthetic traffic"),
    "headroom": ("headroom", "how much more fits: max safe batch per sequence length, or one shape's predicted peak"),
    "postmortem": ("postmortem", "why earlier processes of a running endpoint's service ended (OOM kill, kill, exit) "
                                 "and what they were doing"),
    "baseline": ("baseline", "save a running endpoint's per-layer figures of a model as a baseline file"),
    "diff": ("diff", "compare two baseline files per layer (--fail-above for CI)"),
}


class _UsageError(Exception):
    """An argument error: one line on stderr and exit 2, as every other error (usage with --help)."""


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default where it has one: no "(default: None)" or "(default: False)"."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse prints a usage block, then exits 2
        raise _UsageError(f"{message} (see {self.prog} --help)")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``only``, that subcommand's arguments alone (the others are listed by
    name and help, their modules left unimported: what ``main`` uses to start fast)."""
    parser = _Parser(
        prog=PROG, description="Per-layer PyTorch memory telemetry for Prometheus and OpenTelemetry.",
        epilog="Set MEMPROF_OTEL_DEBUG=1 to get a traceback instead of a one-line error.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_line) in COMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name, help=help_line)
            continue
        module = importlib.import_module(f"{__name__}.{module_name}")
        p = sub.add_parser(name, help=help_line, description=module.__doc__.strip().splitlines()[0],
                           formatter_class=_Formatter)
        module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


def _command_in(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (the first word that is not an option), if it is one of ours."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def _one_line(text: str) -> str:
    return " ".join(str(text).split()) or "unknown error"


def _fail(message: str, code: int) -> int:
    print(f"{PROG}: error: {_one_line(message)}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (the console script passes it to ``sys.exit``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(only=_command_in(argv) or "")  # "": no subcommand module at all
    try:
        args = parser.parse_args(argv)
    except _UsageError as e:
        return _fail(str(e), EXIT_USAGE)
    except SystemExit as e:  # --help and --version: argparse has printed them
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if os.environ.get("MEMPROF_OTEL_DEBUG", "").strip().lower() in ("1", "true", "yes", "on"):
        return int(args.run(args) or 0)
    try:
        return int(args.run(args) or 0)
    except CommandError as e:
        return _fail(str(e), e.exit_code)
    except ConfigError as e:
        return _fail(str(e), EXIT_USAGE)
    except MemprofError as e:
        return _fail(str(e), EXIT_FAILURE)
    except BrokenPipeError:  # `memprof-otel info | head`: the reader left; nothing to say
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return EXIT_FAILURE
    except OSError as e:
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        return _fail(f"{where}{e.strerror or e}", EXIT_FAILURE)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except Exception as e:  # a bug of ours: still one line, with the type to report it by
        return _fail(f"unexpected {type(e).__name__}: {e} (MEMPROF_OTEL_DEBUG=1 shows the traceback)",
                     EXIT_FAILURE)


__all__ = ["COMMANDS", "CommandError", "build_parser", "main"]
