"""Small CPU models whose per-layer figures the baseline tests change on purpose, and the child
process that prints the model's baseline (``python -m tests.integration.support.baseline_models [N]``: with
N, a JSON list of N baselines, each measured in a process of its own forked from this one)."""
from __future__ import annotations

import json
import os
import sys

import torch
from torch import nn

D = 64          # model width
HIDDEN = 250    # each block's intermediate width
BATCH = 8
F32 = 4


class Block(nn.Module):
    """x + down(gelu(up(x))): its transient peak is its intermediates, B x hidden floats each.
    ``cache``: keep the intermediate on the module after the forward (retained bytes, not peak)."""

    def __init__(self, hidden: int, cache: bool = False) -> None:
        super().__init__()
        self.up = nn.Linear(D, hidden)
        self.act = nn.GELU()
        self.down = nn.Linear(hidden, D)
        self.cache = cache
        self.kept: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        if self.cache:
            self.kept = h
        return x + self.down(self.act(h))


class Net(nn.Module):
    """Three blocks and a head; ``hidden`` per block, ``cache`` per block."""

    def __init__(self, hidden: tuple[int, ...] = (HIDDEN,) * 3, cache: tuple[bool, ...] = (False,) * 3,
                 blocks_name: str = "blocks") -> None:
        super().__init__()
        self.blocks_name = blocks_name
        setattr(self, blocks_name, nn.ModuleList(Block(h, c) for h, c in zip(hidden, cache)))
        self.head = nn.Linear(D, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in getattr(self, self.blocks_name):
            x = block(x)
        return self.head(x)


def inputs() -> torch.Tensor:
    return torch.randn(BATCH, D, generator=torch.Generator().manual_seed(0))


def measure(model: nn.Module, name: str = "net"):
    import memprof_otel as mp

    h = mp.instrument(model, name=name)
    try:
        with torch.inference_mode():
            return h.baseline(inputs())
    finally:
        h.uninstrument()


def _one() -> str:
    torch.manual_seed(0)
    return measure(Net()).dumps()


def _forked(n: int) -> list[str]:
    """N baselines, each in a child forked from this process before it ran any op or started any
    memprof-otel thread: fresh processes that skip importing torch again (seconds each)."""
    import memprof_otel.attribution.torch.hooks  # noqa: F401 - the heavy imports, once, before forking

    out = []
    for _ in range(n):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: measure, write, leave without running the parent's exit hooks
            os.close(r)
            code = 1
            try:
                with os.fdopen(w, "wb") as f:
                    f.write(_one().encode())
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            text = f.read().decode()
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"a forked child failed ({status})")
        out.append(text)
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.stdout.write(json.dumps(_forked(int(sys.argv[1]))))
    else:  # this fresh interpreter alone
        sys.stdout.write(_one())
