"""The small token model the post-mortem tests' servers and children run: ``Embedding(100, W)`` ->
two blocks (``Linear(W, W)``, tanh) -> ``Linear(W, 100)``. ``blocks[1].stuck`` set: the next forward
stays in layer ``blocks.1`` until the process is killed (``on_stuck`` is called once it is there)."""
from __future__ import annotations

import threading
import time
from typing import Callable

import torch
from torch import nn


class StuckBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.stuck = threading.Event()
        self.on_stuck: Callable[[], None] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stuck.is_set():
            if self.on_stuck is not None:
                self.on_stuck()
            while True:  # the long forward: in this layer until the process is killed
                time.sleep(0.02)
        return torch.tanh(self.lin(x))


class TokenModel(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, width)
        self.blocks = nn.ModuleList([StuckBlock(width), StuckBlock(width)])
        self.head = nn.Linear(width, 100)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(x)
