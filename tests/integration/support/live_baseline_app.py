"""The ASGI service the live-baseline tests run under a real uvicorn, on the shipped defaults.

A token model of four blocks (``Embedding`` -> 4 x [``Linear(64, W)``, GELU, ``Linear(W, 64)``] ->
``Linear(64, 100)``), each block ``W`` = 256 wide, but block ``LIVE_BASELINE_WIDE_BLOCK`` (default
none) ``LIVE_BASELINE_WIDE`` wide: the "one layer made 5 % wider" build. Routes:
``GET /forward?batch=B&seq=S`` runs one forward of that shape; anything else is memprof-otel's own
endpoint (``POST /v1/baseline``, ``/v1/layers``, ...).
"""
from __future__ import annotations

import asyncio
import os
from typing import Any, Callable
from urllib.parse import parse_qs

import torch
from torch import nn

import memprof_otel as mp

torch.set_num_threads(1)
torch.manual_seed(0)
WIDE_BLOCK = int(os.environ.get("LIVE_BASELINE_WIDE_BLOCK", "-1"))
WIDE = int(os.environ.get("LIVE_BASELINE_WIDE", "256"))


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(64, width)
        self.act = nn.GELU()
        self.down = nn.Linear(width, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(x)))


class TokenModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 64)
        self.blocks = nn.ModuleList([Block(WIDE if i == WIDE_BLOCK else 256) for i in range(4)])
        self.head = nn.Linear(64, 100)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


model = TokenModel().eval()
handle = mp.instrument(model, name="tokens")  # the shipped defaults: no every_n_forwards, no budget
endpoint = mp.asgi_app()


def _forward(batch: int, seq: int) -> None:
    with torch.inference_mode():
        model(torch.randint(0, 100, (batch, seq)))


async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
    if scope["type"] == "http" and scope["path"] == "/forward":
        q = parse_qs(scope.get("query_string", b"").decode())
        await asyncio.to_thread(_forward, int(q["batch"][0]), int(q["seq"][0]))
        body = b"ok"
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain"), (b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": body})
        return
    await endpoint(scope, receive, send)
