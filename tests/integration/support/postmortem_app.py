"""The ASGI application the post-mortem tests run under a real uvicorn / gunicorn.

At import it instruments a small token model with the shipped defaults (the black box folder and
the service name come from ``MEMPROF_OTEL_*``). Routes:

* ``GET /forward?batch=B&seq=S``: one forward of that shape (in a worker thread, as a sync
  endpoint runs), answers this process's pid.
* ``GET /stuck?batch=B&seq=S``: a forward of that shape that stays in layer ``blocks.1`` until
  the process is killed; the pid is written to ``$POSTMORTEM_APP_STUCK`` once it is in there.
  It never answers.
* anything else: memprof-otel's own endpoint (``/metrics``, ``/v1/postmortem``, ...).
"""
from __future__ import annotations

import asyncio
import os
from typing import Any, Callable
from urllib.parse import parse_qs

import torch

import memprof_otel as mp
from tests.integration.support.token_model import TokenModel

torch.set_num_threads(1)


def _report_stuck() -> None:
    path = os.environ.get("POSTMORTEM_APP_STUCK")
    if path:
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(path + ".tmp", path)


model = TokenModel()
model.blocks[1].on_stuck = _report_stuck
handle = mp.instrument(model, name="tokens")
endpoint = mp.asgi_app()


def _forward(batch: int, seq: int) -> None:
    with torch.no_grad():
        model(torch.randint(0, 100, (batch, seq)))


async def _answer(send: Callable[..., Any], body: bytes, status: int = 200) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
    if scope["type"] == "http" and scope["path"] in ("/forward", "/stuck"):
        q = parse_qs(scope.get("query_string", b"").decode())
        batch, seq = int(q.get("batch", ["2"])[0]), int(q.get("seq", ["8"])[0])
        if scope["path"] == "/stuck":
            model.blocks[1].stuck.set()
        await asyncio.to_thread(_forward, batch, seq)
        await _answer(send, str(os.getpid()).encode())
        return
    await endpoint(scope, receive, send)
