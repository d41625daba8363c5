"""The application the pre-fork server tests run under a real gunicorn / uvicorn.

Configured from the environment (``MEMPROF_OTEL_*``). At import it starts monitoring and
instruments a small model; with ``PREFORK_SERVE=1`` it also starts memprof's own endpoint
(``mp.serve()``) — under ``gunicorn --preload`` all of this runs in the master, before the fork.
``app`` is a WSGI app that runs one forward and answers the worker's pid; ``asgi`` is memprof's
endpoint mounted as the whole ASGI app (``uvicorn ...:asgi --workers N``)."""
from __future__ import annotations

import os
from typing import Any, Callable, Iterable

import torch

import memprof_otel as mp

# One intra-op thread: GNU OpenMP is not fork-safe. A matrix product run on several threads in the
# master (the warm-up below, under --preload) left every worker's first forward waiting forever on
# OpenMP threads that were not forked (seen on a 2-core AMD EPYC: MKL's sgemm through libgomp).
torch.set_num_threads(1)
mp.start_monitoring()
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
handle = mp.instrument(model, name="tiny")
with torch.no_grad():
    model(torch.randn(4, 32))
if os.environ.get("PREFORK_SERVE") == "1":
    endpoint = mp.serve()


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    with torch.no_grad():
        model(torch.randn(4, 32))
    body = str(os.getpid()).encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


asgi = mp.asgi_app()
