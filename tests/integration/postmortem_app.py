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
import threading
import time
from typing import Any, Callable
from urllib.parse import parse_qs

import torch
from torch import nn

import memprof_otel as mp

torch.set_num_threads(1)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.stuck = threading.Event()  # set: the next forward through here never ends

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stuck.is_set():
            path = os.environ.get("POSTMORTEM_APP_STUCK")
            if path:
                with open(path + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.replace(path + ".tmp", path)
            while True:
                time.sleep(0.05)
        return torch.tanh(self.lin(x))


class TokenModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.blocks = nn.ModuleList([Block(32), Block(32)])
        self.head = nn.Linear(32, 100)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


model = TokenModel()
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
