"""The processes of the black box test.

    python -m tests.integration.support.blackbox_child victim sigkill|oom [CGROUP_DIR]
    python -m tests.integration.support.blackbox_child reader

``victim``: joins ``CGROUP_DIR`` (its ``cgroup.procs``) first when given, instruments a small
token model (every forward attributed, sampler every ``INTERVAL_S``), runs forwards of several
shapes for ``WARM_S``, prints ``long <pid>`` and starts one forward of shape ``LONG_SHAPE`` that
never ends on its own: in ``sigkill`` mode it computes in layer ``blocks.1`` until the test kills
it; in ``oom`` mode it keeps tensors alive in layer ``blocks.1`` until the kernel kills it.
``reader``: instruments a model (which reads the black boxes left behind), serves the endpoint
and prints its URL; it ends when its stdin closes.

The black box folder comes from ``MEMPROF_OTEL_BLACKBOX_DIR``, the window from
``MEMPROF_OTEL_BLACKBOX_WINDOW``.
"""
from __future__ import annotations

import os
import sys
import time

INTERVAL_S = 0.1
WARM_S = 4.0
LONG_SHAPE = (3, 37)


def victim(mode: str, cgroup: str | None) -> None:
    if cgroup:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    import torch
    from torch import nn

    import memprof_otel as mp

    class Mix(nn.Module):
        """x -> tanh(x w), ``iters`` times: compute with no submodule (the innermost layer is this one)."""

        def __init__(self, width: int) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(width, width) / width ** 0.5)
            self.iters = 1
            self.hoard = False

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            kept = []
            for _ in range(self.iters):
                x = torch.tanh(x @ self.w)
                if self.hoard:  # every step's activations kept: the forward's memory grows until the kill
                    kept.append(torch.ones(4 << 20))  # 16 MiB
            return x

    class TokenModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(100, 64)
            self.blocks = nn.ModuleList([Mix(64), Mix(64)])
            self.head = nn.Linear(64, 100)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.emb(ids)
            for b in self.blocks:
                x = b(x)
            return self.head(x)

    torch.set_num_threads(1)
    model = TokenModel()
    mp.instrument(model, name="victim", every_n_forwards=1, overhead_budget=1.0,
                  config={"sampler": {"interval": INTERVAL_S}})
    end = time.monotonic() + WARM_S
    shapes = [(1, 8), (2, 16), (4, 32)]
    i = 0
    with torch.no_grad():
        while time.monotonic() < end:
            model(torch.randint(0, 100, shapes[i % len(shapes)]))
            i += 1
            time.sleep(0.01)
        slow = model.blocks[1]
        slow.iters = 10 ** 9
        slow.hoard = mode == "oom"
        print(f"long {os.getpid()}", flush=True)
        model(torch.randint(0, 100, LONG_SHAPE))
    print("the long forward ended", flush=True)


def reader() -> None:
    import torch

    import memprof_otel as mp

    mp.instrument(torch.nn.Linear(4, 4), name="reader")
    srv = mp.serve(port=0)
    print(srv.url, flush=True)
    sys.stdin.read()
    mp.shutdown()


if __name__ == "__main__":
    if sys.argv[1] == "victim":
        victim(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    else:
        reader()
